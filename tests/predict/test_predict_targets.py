"""The issue's accuracy targets, asserted on the shared CM-DARE data (no threshold is loosened)."""

from __future__ import annotations

import pytest

from cmdare.predict.evaluate import evaluate_task

CMDARE_STEP = "cmdare StepTimeModel"
SVR_STEP = "published SVR on normalized FLOPs (per GPU)"


@pytest.fixture(scope="module")
def step_errors():
    frame, _ = evaluate_task("step_time", protocols=("random", "loco", "logo"))
    return frame.set_index(["model", "protocol", "subset"])["mape"]


@pytest.fixture(scope="module")
def cluster_errors():
    frame, preds = evaluate_task("cluster_speed", protocols=("loo",))
    return frame.set_index(["model", "protocol", "subset"])["mape"], preds


@pytest.fixture(scope="module")
def checkpoint_errors():
    frame, _ = evaluate_task("checkpoint_remote", protocols=("random", "loco"))
    return frame.set_index(["model", "protocol", "subset"])["mape"]


@pytest.mark.parametrize("gpu", ["K80", "P100"])
def test_step_time_leave_one_cnn_out_at_most_7_percent(step_errors, gpu):
    assert step_errors[(CMDARE_STEP, "loco", gpu)] <= 7.0


@pytest.mark.parametrize(("gpu", "published"), [("K80", 9.96), ("P100", 13.8)])
def test_step_time_random_split_beats_published_svr(step_errors, gpu, published):
    assert step_errors[(CMDARE_STEP, "random", gpu)] < published


@pytest.mark.parametrize("gpu", ["K80", "P100"])
def test_replicated_svr_baseline_is_far_worse_on_unseen_cnns(step_errors, gpu):
    # Replicated published approach: about 10% (K80) and 18% (P100) leave-one-CNN-out.
    svr = step_errors[(SVR_STEP, "loco", gpu)]
    assert 10.0 <= svr <= 25.0
    assert step_errors[(CMDARE_STEP, "loco", gpu)] < svr / 2


def test_step_time_unseen_gpu_beats_flops_ratio_baseline(step_errors):
    ours = step_errors[(CMDARE_STEP, "logo", "all")]
    baseline = step_errors[("published linear on FLOPs/TFLOPS", "logo", "all")]
    assert ours < 25.0
    assert ours < baseline / 2


def test_cluster_speed_leave_one_configuration_out_at_most_5_percent(cluster_errors):
    errors, _ = cluster_errors
    assert errors[("cmdare PSQueueModel", "loo", "all")] <= 5.0
    assert errors[("cmdare PSQueueModel", "loo", "all")] < errors[("Optimus f(p,w)", "loo", "all")]
    assert errors[("cmdare PSQueueModel", "loo", "all")] < errors[("sum of workers", "loo", "all")] / 4


def test_cluster_speed_saturated_p100_points_are_predicted(cluster_errors):
    _, preds = cluster_errors
    y, p, meta = preds[("cmdare PSQueueModel", "loo")]
    saturated = ((meta["gpu"] == "P100") & (meta["Workers"] >= 5)).to_numpy()
    ape = abs(p - y) / y * 100
    assert saturated.sum() == 16
    # Median over the 16 saturated P100 configurations (one run, shakebig x7, sits 25% below its
    # neighbours for most of its duration and is the only point above 17%).
    assert float(sorted(ape[saturated])[8]) <= 5.0
    assert ape.mean() <= 5.0


def test_checkpoint_random_split_beats_published_svr(checkpoint_errors):
    assert checkpoint_errors[("cmdare CheckpointModel", "random", "all")] < 5.38
    assert (
        checkpoint_errors[("cmdare CheckpointModel", "random", "all")]
        < checkpoint_errors[("published SVR on size", "random", "all")]
    )


def test_checkpoint_leave_one_cnn_out_is_reported(checkpoint_errors):
    # Not a target; reported in docs/models.md (7.27% vs 7.88% for the SVR baseline).
    ours = checkpoint_errors[("cmdare CheckpointModel", "loco", "all")]
    assert 0 < ours < checkpoint_errors[("published SVR on size", "loco", "all")]
