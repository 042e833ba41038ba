"""Bottleneck diagnosis and mitigation decisions, on inputs shaped like CM-DARE's measurements."""

from __future__ import annotations

import csv
import statistics

import pytest

from cmdare.control.bottleneck import (
    AddShard,
    BottleneckKind,
    NoAction,
    Rebalance,
    ReplaceWorker,
    decide_mitigation,
    diagnose,
)
from cmdare.errors import UserInputError
from cmdare.public_data import public_data_dir


def cluster_speeds(gpu: str, cnn: str) -> dict[int, float]:
    """Median global steps/s with 1 PS and n = 1..8 workers (after a 20% warm-up)."""
    root = public_data_dir() / "cmdare" / "speed_and_cluster_size" / gpu
    out = {}
    for n in range(1, 9):
        (run,) = root.glob(f"{cnn}{gpu}worker{n}")
        with open(run / "run_.-tag-global_step_sec.csv") as f:
            values = [float(r["Value"]) for r in csv.DictReader(f)]
        out[n] = statistics.median(values[len(values) // 5:])
    return out


def test_p100_one_ps_saturates_at_4_to_5_workers_and_gets_a_shard():
    speeds = cluster_speeds("p100", "res32")
    single, peak = speeds[1], max(speeds.values())
    kinds = {}
    for n, measured in speeds.items():
        # The PS is busy in proportion to the load it serves, relative to the plateau.
        busy = [min(1.0, measured / peak)]
        d = diagnose(measured, measured, busy, [measured / n] * n, [single] * n)
        kinds[n] = d.kind
    assert all(kinds[n] is BottleneckKind.NONE for n in (1, 2, 3))
    assert all(kinds[n] is BottleneckKind.PS_SATURATED for n in range(5, 9))
    d8 = diagnose(speeds[8], speeds[8], [0.97], [speeds[8] / 8] * 8, [single] * 8)
    action = decide_mitigation(d8)
    assert isinstance(action, AddShard) and action.count == 1
    assert "busy" in action.reason and d8.shards == 1


def test_k80_eight_workers_do_not_saturate_one_ps():
    speeds = cluster_speeds("k80", "res32")
    d = diagnose(speeds[8], speeds[8], [0.6], [speeds[8] / 8] * 8, [speeds[1]] * 8)
    assert d.kind is BottleneckKind.NONE
    assert isinstance(decide_mitigation(d), NoAction)


def test_straggling_shard_is_rebalanced():
    d = diagnose(30.0, 45.0, [0.4, 0.95, 0.45], [7.5] * 4, [11.5] * 4)
    assert d.kind is BottleneckKind.STRAGGLING_SHARD and d.shard == 1
    assert decide_mitigation(d) == Rebalance(1, decide_mitigation(d).reason)


def test_slow_worker_is_replaced():
    d = diagnose(15.5, 18.2, [0.3], [4.5, 4.5, 2.0, 4.5], [4.55] * 4)
    assert d.kind is BottleneckKind.SLOW_WORKER and d.worker == 2
    action = decide_mitigation(d)
    assert isinstance(action, ReplaceWorker) and action.worker == 2


def test_uniform_slowdown_with_high_latency_is_network():
    # CM-DARE's 30.3 ms setting: every worker slower alike, the PS idle.
    d = diagnose(28.0, 36.0, [0.3], [3.5] * 8, [4.5] * 8, latency_ms=30.3)
    assert d.kind is BottleneckKind.NETWORK_LATENCY
    assert any("30.3 ms" in e for e in d.evidence)
    assert isinstance(decide_mitigation(d), NoAction)
    low = diagnose(28.0, 36.0, [0.3], [3.5] * 8, [4.5] * 8, latency_ms=0.3)
    assert low.kind is BottleneckKind.NONE  # low latency cannot explain it
    assert low.gap_fraction == pytest.approx(1 - 28 / 36)


def test_bad_inputs():
    with pytest.raises(UserInputError):
        diagnose(10.0, 10.0, [0.5], [1.0, 2.0], [1.0])
    with pytest.raises(UserInputError):
        diagnose(10.0, 0.0, [0.5], [1.0], [1.0])
    with pytest.raises(UserInputError):
        diagnose(10.0, 10.0, [1.5], [1.0], [1.0])
