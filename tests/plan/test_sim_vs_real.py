"""The simulator against a real local cmdare run under injected revocations (issues 7 and 28).

A small version of ``bench/sim_vs_real.py``: one real run of 3 emulated transient workers + 1 PS with
revocations injected by the engine, then the same job simulated through :mod:`cmdare.plan` with the run's
emulated speed and start-up; times in the run's emulated cloud time.
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
    """The lifetimes a real run's servers lived (its membership timeline, in emulated seconds), replayed in the
    simulator with the same start-up, revoke at the real run's revocation times."""
    from cmdare.control.membership import MembershipEvent
    from cmdare.plan import PlanModels
    from cmdare.plan.replay import FixedStartup, FlatPrices, MeasuredSpeed, ScriptedLifetimes
    from cmdare.plan.simulator import Simulator

    bench = _bench()
    run = bench.RealRun(steps=1000, workers=2, end_s=30.0)
    run.timeline = [MembershipEvent("join", 0.0, 0, 0), MembershipEvent("join", 0.0, 1, 1),
                    MembershipEvent("loss", 4.0, 0, 0), MembershipEvent("join", 6.0, 2, 0),
                    MembershipEvent("loss", 13.0, 2, 0), MembershipEvent("join", 15.0, 3, 0),
                    MembershipEvent("loss", 20.0, 1, 1), MembershipEvent("join", 22.0, 4, 1)]
    o = bench.analyze(run)
    assert o.revocations == 3 and o.emulated_s == 30.0
    assert o.script == [4.0, 7.0, np.inf, 20.0, np.inf, np.inf]  # slot-major, the order the simulator draws
    job, cluster = _job(bench, workers=2, steps=1000)
    models = PlanModels(MeasuredSpeed({bench.GPU: 10.0}), ScriptedLifetimes({bench.GPU: o.script}),
                        FixedStartup(2.0), FlatPrices({bench.GPU: 0.0, "cpu": 0.0}), checkpoint_s=0.0)
    _, timeline = Simulator(job, cluster, models).run_traced(np.random.default_rng(0))
    assert [e.time for e in timeline if e.kind == "loss"] == pytest.approx([4.0, 13.0, 20.0])
    assert [e.time for e in timeline if e.kind == "join" and e.time > 0] == pytest.approx([6.0, 15.0, 22.0])


@pytest.mark.slow  # one real run: 30-100 s on the shared 2 cores
def test_simulator_agrees_with_a_real_run_under_revocations():
    """A real (emulated) run with injected revocations vs the simulator, in the run's cloud time: the replay of
    its own revocations agrees to a fraction of a percent, the Monte Carlo within 10%."""
    bench = _bench()
    out = bench.compare(workers=3, steps=3000, revocations=bench.Revocations("every", every_s=8.0, first_s=3.0),
                        startup_s=2.0, step_s=0.05, seed=7, runs=1000, real_runs=1)
    print(json.dumps(out))  # the measured figures, with -s
    assert out["real_revocations"][0] >= 2, out  # revocations happened and were replaced
    assert out["replay_error_pct"] <= 1.0, out  # the run's own schedule, one simulated run
    assert out["error_pct"] <= 10.0, out  # many seeded runs of the same schedule vs the real run
