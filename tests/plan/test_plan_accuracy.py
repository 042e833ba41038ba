"""Accuracy as the planner's third objective: predicted accuracy per run, --min-accuracy, clear failures."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from plan_toys import ExpLifetimes, run_cli, toy_models

from cmdare.errors import UserInputError
from cmdare.plan.adapters import PredictedAccuracy
from cmdare.plan.recommender import enumerate_clusters, recommend
from cmdare.plan.simulator import simulate
from cmdare.plan.spec import AccuracyPredictor, ClusterSpec, JobSpec, WorkerGroup


class ToyAccuracy:
    """0.95 with one worker, -1 point per extra asynchronous worker, -2 points per revocation."""

    def final_accuracy(self, workers: int, steps: int, revocations: np.ndarray, topology: str = "ps") -> np.ndarray:
        stale = workers - 1 if topology == "ps" else 0
        return 0.95 - 0.01 * stale - 0.02 * np.asarray(revocations, float)


def _models():
    base = toy_models(ExpLifetimes(5000.0), startup_s=100.0, cap_per_ps=4.0)
    return dataclasses.replace(base, accuracy=ToyAccuracy())


def _clusters():
    return enumerate_clusters(["a", "b"], ["r1"], max_workers=4, max_ps=2)


def test_protocol_and_adapter():
    assert isinstance(ToyAccuracy(), AccuracyPredictor)
    real = PredictedAccuracy()
    assert isinstance(real, AccuracyPredictor)
    acc = real.final_accuracy(8, 64000, np.array([0, 0, 2]))
    one = real.final_accuracy(1, 64000, np.array([0]))
    assert acc.shape == (3,) and acc[0] == acc[1] > acc[2] and one[0] > acc[0]
    lin = PredictedAccuracy(lr_policy="linear").final_accuracy(8, 64000, np.array([2]))
    assert lin[0] > acc[2]  # scaling the learning rate with the workers costs less per revocation


def test_an_allreduce_run_is_predicted_as_synchronous_training_of_the_same_samples():
    """8 members for 8,000 steps train the batches 8 asynchronous workers train in 64,000: no staleness, so the
    accuracy of one worker at 8x the batch for 8,000 steps, above the asynchronous run's; revocations cost alike."""
    real = PredictedAccuracy(batch_size=128)
    group = real.final_accuracy(8, 8000, np.array([0, 2]), topology="allreduce")
    large_batch = PredictedAccuracy(batch_size=8 * 128).final_accuracy(1, 8000, np.array([0, 2]))
    np.testing.assert_array_equal(group, large_batch)
    np.testing.assert_allclose(group, real.final_accuracy(1, 64000, np.array([0, 2])), rtol=0, atol=1e-12)
    asynchronous = real.final_accuracy(8, 64000, np.array([0, 2]))
    assert (group > asynchronous).all() and group[0] - group[1] == pytest.approx(asynchronous[0] - asynchronous[1])


def test_simulated_runs_differ_in_revocations_and_accuracy():
    cluster = ClusterSpec((WorkerGroup("a", 4, True, "r1"),), ps=1, region="r1")
    s = simulate(JobSpec("toy", 20000), cluster, _models(), runs=60, seed=3)
    assert s.revocations_mean > 0
    assert s.extra["accuracy_p5"] < s.extra["accuracy_mean"] <= 0.95 - 0.03
    expected = 0.95 - 0.03 - 0.02 * s.revocations_mean
    assert s.extra["accuracy_mean"] == pytest.approx(expected)
    assert "accuracy_mean" not in simulate(JobSpec("toy", 20000), cluster, toy_models(), runs=5).extra


def test_min_accuracy_keeps_only_qualifying_configurations():
    job, models, clusters = JobSpec("toy", 20000), _models(), _clusters()
    free = recommend(job, clusters, models, runs=30, seed=1)
    rec = recommend(job, clusters, models, runs=30, seed=1, min_accuracy=0.93)
    assert rec.constraint_met and rec.front
    assert all(o.accuracy >= 0.93 for o in rec.front) and rec.choice.accuracy >= 0.93
    assert min(o.accuracy for o in free.front) < 0.93  # the threshold removed something
    assert "predicted to reach 93.0% accuracy" in rec.message
    unpruned = recommend(job, clusters, models, runs=30, seed=1, min_accuracy=0.93, prune=False)
    assert [o.cluster for o in unpruned.front] == [o.cluster for o in rec.front]


def test_unreachable_threshold_names_the_most_accurate():
    rec = recommend(JobSpec("toy", 20000), _clusters(), _models(), runs=20, seed=1, min_accuracy=0.99)
    assert not rec.constraint_met
    best = max(o.accuracy for o in rec.options)
    assert rec.choice.accuracy == best and rec.choice.cluster.n_workers == 1
    assert rec.message.startswith("no configuration is predicted to reach 99.0% accuracy; the most accurate is ")
    assert rec.choice.cluster.label() in rec.message


def test_bad_thresholds():
    job, clusters = JobSpec("toy", 20000), _clusters()[:3]
    with pytest.raises(UserInputError, match="fraction"):
        recommend(job, clusters, _models(), runs=2, min_accuracy=91)
    with pytest.raises(UserInputError, match="no accuracy model"):
        recommend(job, clusters, toy_models(), runs=2, min_accuracy=0.9)


# ICAC 2019's job: T2T ResNet-32, 64k steps at Tensor2Tensor's batch of 128 (what the accuracy points were measured at)
PLAN = ["plan", "--model", "t2t_resnet32", "--steps", "64000", "--batch-size", "128", "--gpus", "k80", "--max-workers",
        "8", "--runs", "10"]


def test_cli_simulate_json_reports_accuracy(monkeypatch, capsys):
    sim = ["plan", "simulate", "--model", "t2t_resnet32", "--steps", "64000", "--runs", "30", "--seed", "1",
           "--transient", "--json"]
    one = json.loads(run_cli(monkeypatch, capsys, *sim, "--workers", "k80:1")[1])
    eight = json.loads(run_cli(monkeypatch, capsys, *sim, "--workers", "k80:8")[1])
    assert 0.85 < eight["accuracy"]["mean"] < one["accuracy"]["mean"] < 0.94
    assert eight["accuracy"]["p5"] <= eight["accuracy"]["mean"]
    assert eight["time_s"]["mean"] < one["time_s"]["mean"]  # faster, but less accurate


def test_cli_min_accuracy(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, *PLAN, "--min-accuracy", "0.91", "--json")
    data = json.loads(out)
    assert code == 0 and data["constraint_met"]
    assert all(o["accuracy_mean"] >= 0.91 for o in data["front"])
    code, out, _ = run_cli(monkeypatch, capsys, *PLAN, "--min-accuracy", "0.91")
    assert code == 0 and "accuracy P5" in out and "predicted to reach 91.0% accuracy" in out
    code, out, _ = run_cli(monkeypatch, capsys, *PLAN, "--min-accuracy", "0.97", "--json")
    data = json.loads(out)
    assert code == 0 and not data["constraint_met"]
    # synchronous all-reduce is predicted one worker's accuracy (the same samples, no staleness), and is faster
    assert data["message"].startswith("no configuration is predicted to reach 97.0% accuracy; the most accurate is ")
    assert "+ all-reduce" in data["message"].split(":")[0], data["message"]
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--min-accuracy", "91")
    assert code == 1 and "fraction" in err and "Traceback" not in err
