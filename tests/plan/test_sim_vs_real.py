"""The simulator against a real local cmdare run under injected revocations (issue 7, < 10% wall time).

A small version of ``bench/sim_vs_real.py``: one real run of 3 emulated transient workers + 1 PS with
revocations injected by the engine, then the same job simulated through :mod:`cmdare.plan` with the
run's measured per-membership speed and replacement delay.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sim_vs_real.py"


def _bench():
    spec = importlib.util.spec_from_file_location("cmdare_bench_sim_vs_real", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_periodic_lifetimes_follow_the_schedule():
    """The ``every=S,first=F`` sampler revokes one training worker per tick, from its request."""
    bench = _bench()
    sampler = bench.PeriodicLifetimes(workers=3, every_s=4.0, first_s=2.0, join_s=5.0, ticks=6)
    rng = np.random.default_rng(0)
    lives = sampler.sample(rng, "local", "r", 3 * sampler.per).reshape(3, sampler.per)
    # Ticks at 2, 6, ..., 22 s; a replacement trains 5 s after its request, so every tick finds a worker
    # and no slot is hit more than every 8 s (at most 3 times in 6 ticks: nothing left for on-demand draws).
    revocation_times = [np.cumsum(row[np.isfinite(row)]) for row in lives]
    assert sampler.extra == []
    assert sorted(np.concatenate(revocation_times).tolist()) == pytest.approx([2.0, 6.0, 10.0, 14.0, 18.0, 22.0])
    for row_times in revocation_times:
        assert np.all(np.diff(row_times) >= 5.0)  # revoked again only after its replacement joined


@pytest.mark.slow  # one real run: 50-100 s on the shared 2 cores, most of it Ray and actor start-up
def test_simulator_agrees_with_a_real_run_under_revocations():
    """A real run with injected revocations vs the simulator: within 10% on training wall time."""
    bench = _bench()
    out = bench.compare(workers=3, steps=1500, revocations=bench.Revocations("every", every_s=10.0, first_s=5.0),
                        startup_s=2.0, seed=7, runs=1000, real_runs=1)
    print(json.dumps(out))  # the measured figures, with -s
    assert out["real_revocations"][0] >= 2, out  # revocations happened and were replaced
    assert len(out["observed_recovery_s"]) >= 1, out
    assert out["replay_error_pct"] <= 10.0, out  # the run's own schedule and delays, one simulated run
    assert out["error_pct"] <= 10.0, out  # many seeded runs of the same schedule vs the real run
