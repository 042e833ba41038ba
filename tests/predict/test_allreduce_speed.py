"""All-reduce beside a parameter server in the models: the ring's cost, the step's overlap with backward, and the
choices the issue names (all-reduce for a large model on a slow link, a PS for a small model on mixed GPUs)."""

from __future__ import annotations

import json

import pytest

from cli_inprocess import one_error, run_cmdare
from cmdare.predict.allreduce_speed import (
    BUCKET_BYTES,
    allreduce_step_s,
    compare_topologies,
    crossover_link_gbps,
    ring_allreduce_s,
)
from cmdare.predict.workloads import workload_features


def test_a_ring_moves_2_n_minus_1_over_n_of_the_model_per_member():
    # 2 members, 1e8 parameters = 400 MB, 8 Gbit/s = 1e9 B/s: 2 * 1/2 * 0.4 s, plus 2 latency rounds
    assert ring_allreduce_s(1e8, 2, 8.0, 0.5) == pytest.approx(0.4 + 2 * 0.0005)
    assert ring_allreduce_s(1e8, 4, 8.0, 0.0) == pytest.approx(2 * 3 / 4 * 0.4)
    assert ring_allreduce_s(1e8, 1, 8.0, 0.5) == 0.0


def test_a_step_hides_the_ring_behind_backward_and_waits_for_the_slowest_member():
    small = 1e6  # 4 MB: one bucket, all of it after backward
    ring = ring_allreduce_s(small, 2, 10.0, 0.3)
    assert allreduce_step_s([0.1, 0.1], small) == pytest.approx(0.1 + ring)
    big = 1e8  # 400 MB over 10 Gbit/s: 0.32 s, longer than backward: the ring's end sets the step
    ring = ring_allreduce_s(big, 2, 10.0, 0.3)
    assert allreduce_step_s([0.1, 0.3], big) == pytest.approx(max(0.3 + ring * BUCKET_BYTES / 4e8, 0.1 + ring))
    assert allreduce_step_s([0.1, 0.3], small) > allreduce_step_s([0.1, 0.1], small)  # the slowest gates


def test_a_large_model_on_a_slow_link_trains_faster_with_all_reduce():
    resnet50 = workload_features("resnet50", (3, 224, 224))
    speeds = compare_topologies(resnet50, {"v100": 4}, ps=1, link_gbps=1.0)
    assert speeds.recommended == "allreduce"
    assert speeds.allreduce_batches_per_s > 2 * speeds.ps_batches_per_s
    assert speeds.members == 4 and speeds.allreduce_batches_per_s == pytest.approx(4 * speeds.allreduce_steps_per_s)


def test_a_small_model_on_mixed_gpus_trains_faster_with_a_ps():
    """Asynchronous PS workers add their speeds; an all-reduce step waits for the K80."""
    res15 = workload_features("t2t_resnet15")
    speeds = compare_topologies(res15, {"k80": 2, "v100": 2}, ps=1, link_gbps=10.0)
    assert speeds.recommended == "ps", speeds
    below, flip = crossover_link_gbps(res15, {"k80": 2, "v100": 2})
    assert below == "allreduce" and flip is not None and 1.0 < flip < 10.0  # a slow link chokes the PS first


def test_the_link_speed_leaves_the_ps_answer_as_it_was_at_its_default(tmp_path):
    base = run_cmdare(tmp_path, "predict", "cluster-speed", "--model", "t2t_resnet15", "--workers", "v100:4")
    at_10 = run_cmdare(tmp_path, "predict", "cluster-speed", "--model", "t2t_resnet15", "--workers", "v100:4",
                       "--link-gbps", "10")
    slow = run_cmdare(tmp_path, "predict", "cluster-speed", "--model", "t2t_resnet15", "--workers", "v100:4",
                      "--link-gbps", "1")
    assert base[0] == at_10[0] == slow[0] == 0 and base[1] == at_10[1]
    assert float(slow[1].split()[0]) < float(base[1].split()[0])


def test_cluster_speed_with_allreduce_says_both_and_why(tmp_path):
    code, out, err = run_cmdare(tmp_path, "predict", "cluster-speed", "--model", "t2t_resnet15", "--workers",
                                "k80:2,v100:2", "--topology", "allreduce")
    assert code == 0 and out.strip().endswith("batches/s)") and "steps/s of 4 batches" in out
    assert "the slowest GPU type gates every all-reduce step" in err
    assert "a PS trains" in err and "Gbit/s" in err


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--topology", "allreduce", "--ps", "2"], "--ps means nothing with --topology allreduce"),
    (["--topology", "allreduce", "--placement", "greedy", "--interval", "0.9"],
     "--placement, --interval mean nothing with --topology allreduce"),
    (["--topology", "ring"], "unknown --topology 'ring'; valid: ps, allreduce"),
    (["--topology", "allreduce", "--link-gbps", "0"], "--link-gbps must be positive"),
])
def test_bad_topology_options_are_one_line(tmp_path, extra, fragment):
    res = run_cmdare(tmp_path, "predict", "cluster-speed", "--model", "t2t_resnet15", "--workers", "v100:4", *extra)
    assert one_error(res, fragment), res


def test_plan_names_the_topology_it_recommends_for_its_choice(tmp_path):
    code, out, _ = run_cmdare(tmp_path, "plan", "--model", "t2t_resnet15", "--steps", "200000", "--deadline", "1h",
                              "--runs", "5", "--json", "--link-gbps", "10")
    assert code == 0
    topology = json.loads(out)["topology"]
    assert topology["recommended"] in ("ps", "allreduce") and topology["link_gbps"] == 10.0
    assert topology["allreduce_batches_per_s"] > 0 and topology["ps_batches_per_s"] > 0
    assert any(n.startswith("topology: ") for n in json.loads(out)["notes"])
