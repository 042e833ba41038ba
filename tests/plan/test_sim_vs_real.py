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


def _job(bench, workers: int, steps: int):
    from cmdare.plan import ClusterSpec, JobSpec, WorkerGroup

    job = JobSpec("local", steps, checkpoint_every_steps=10**9)
    cluster = ClusterSpec((WorkerGroup(bench.GPU, workers, transient=True),), ps=1, replacement="same")
    return job, cluster


def test_periodic_source_is_the_kernels_schedule():
    """``every=S,first=F`` in the Monte Carlo is the kernel's PeriodicRevocations: one trained worker per
    tick from t=first, a replacement eligible once it joined; seeded per run, reproducibly."""
    from cmdare.plan import PlanModels
    from cmdare.plan.replay import FixedStartup, FlatPrices, ScriptedLifetimes
    from cmdare.plan.simulator import Simulator

    bench = _bench()
    job, cluster = _job(bench, workers=3, steps=75)  # 25 s at 3 workers: ticks at 2, 6, ..., 22 s and later
    models = PlanModels(bench.TableSpeed({1: 1.0, 2: 2.0, 3: 3.0}), ScriptedLifetimes(), FixedStartup(5.0),
                        FlatPrices({bench.GPU: 0.0, "cpu": 0.0}), checkpoint_s=0.0)

    def losses(seed: int) -> list[tuple[float, int, int]]:
        sim = Simulator(job, cluster, models, revocations=bench.periodic_source(4.0, 2.0, seed))
        result, timeline = sim.run_traced(np.random.default_rng(0))
        assert result.finished
        return [(e.time, e.worker_id, e.slot) for e in timeline if e.kind == "loss"]

    got = losses(3)
    times = [t for t, _, _ in got]
    # A replacement joins 5 s after its revocation, so every tick finds a trained worker.
    assert times == pytest.approx([2.0 + 4.0 * k for k in range(len(times))])
    assert len(times) >= 6
    for slot in range(3):
        slot_times = [t for t, _, s in got if s == slot]
        assert np.all(np.diff(slot_times) >= 5.0)  # revoked again only after its replacement joined
    assert losses(3) == got  # the same seed: the same victims
    assert any(losses(k) != got for k in range(4, 8))  # the victims are drawn, not fixed


def test_lifetime_mode_draws_plain_lifetimes():
    """No hand correction: the Monte Carlo's lifetimes are the model's own draws (both drivers count
    them from the server's ready time)."""
    from cmdare.measure.lifetime_models import ExponentialLifetime

    bench = _bench()
    model = ExponentialLifetime(45.0)
    draws = bench.ModelLifetimes(model).sample(np.random.default_rng(5), bench.GPU, "r", 9)
    assert draws.tolist() == model.sample(np.random.default_rng(5), 9).tolist()


def test_replay_reproduces_the_runs_revocation_times():
    """The replay script counts a replacement's lifetime from its join in the simulator (revocation +
    observed delay), so the replayed run revokes at the real run's revocation times."""
    from types import SimpleNamespace

    from cmdare.plan import PlanModels
    from cmdare.plan.replay import FlatPrices, ScriptedLifetimes
    from cmdare.plan.simulator import Simulator

    bench = _bench()

    def event(kind, time, worker, **details):
        return SimpleNamespace(kind=kind, time=time, worker_id=worker, details=details)

    run = bench.RealRun(steps=10**6, workers=2)
    run.steps_log = [(100.5 + 0.5 * k, 10 * (k + 1), 0.5) for k in range(50)]  # t0 = 100, last report at 125
    run.events = [
        event("server_joined", 100.0, 0, requested_at=95.0, joined_at=100.0),
        event("server_joined", 100.2, 1, requested_at=95.0, joined_at=100.2),
        event("revocation", 104.0, 0),
        event("replacement_joined", 110.0, 2, replaces_worker=0, recovery_s=6.0, requested_at=104.1,
              startup_s=2.0, joined_at=110.0),
        event("revocation", 113.0, 2),
        event("replacement_joined", 118.0, 3, replaces_worker=2, recovery_s=5.0, requested_at=113.1,
              startup_s=2.0, joined_at=118.0),
        event("revocation", 120.0, 1),  # its replacement had not joined by the end
    ]
    o = bench.analyze(run)
    assert o.initial_offset_s == pytest.approx([5.0, 5.0])
    assert o.replacement_clock_lag_s == pytest.approx([3.9, 2.9])  # engine ready -> first chunk
    job, cluster = _job(bench, workers=2, steps=1000)
    models = PlanModels(bench.TableSpeed({1: 10.0, 2: 20.0}), ScriptedLifetimes({bench.GPU: o.script}),
                        bench.ScriptedStartup(o.replay_delays_s), FlatPrices({bench.GPU: 0.0, "cpu": 0.0}),
                        checkpoint_s=0.0)
    _, timeline = Simulator(job, cluster, models).run_traced(np.random.default_rng(0))
    assert [e.time for e in timeline if e.kind == "loss"] == pytest.approx([4.0, 13.0, 20.0])
    # Replacements join after their observed delays; the last one, still starting when the run ended,
    # after the rest of the run + 1 s (120 + 6 s).
    assert [e.time for e in timeline if e.kind == "join" and e.time > 0] == pytest.approx([10.0, 18.0, 26.0])


@pytest.mark.slow  # one real run: 30-100 s on the shared 2 cores (6,000 steps, 4 revocations at today's speed)
def test_simulator_agrees_with_a_real_run_under_revocations():
    """A real run with injected revocations vs the simulator: within 10% on training wall time."""
    bench = _bench()
    out = bench.compare(workers=3, steps=6000, revocations=bench.Revocations("every", every_s=5.0, first_s=3.0),
                        startup_s=2.0, seed=7, runs=1000, real_runs=1)
    print(json.dumps(out))  # the measured figures, with -s
    assert out["real_revocations"][0] >= 2, out  # revocations happened and were replaced
    assert len(out["observed_recovery_s"]) >= 1, out
    assert out["replay_error_pct"] <= 10.0, out  # the run's own schedule and delays, one simulated run
    assert out["error_pct"] <= 10.0, out  # many seeded runs of the same schedule vs the real run
