"""The simulator against hand-computed runs with deterministic toy models."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from plan_toys import ExpLifetimes, FlatPrices, ScriptedLifetimes, toy_models

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.plan.simulator import Simulator, simulate
from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup, parse_workers


def cluster(*groups: tuple[str, int, bool], ps: int = 1, **kw) -> ClusterSpec:
    return ClusterSpec(tuple(WorkerGroup(g, n, t) for g, n, t in groups), ps=ps, **kw)


def test_on_demand_run_is_exact_time_and_cost():
    job = JobSpec("toy", 1000)
    s = simulate(job, cluster(("a", 2, False)), toy_models(), runs=5, seed=3)
    assert s.time_mean_s == pytest.approx(500.0)
    assert s.time_p95_s == pytest.approx(500.0)
    # two workers at 0.001 USD/s and one PS at 0.0001 USD/s for 500 s
    assert s.cost_mean_usd == pytest.approx(500 * (2 * 0.001 + 0.0001))
    assert s.revocations_mean == 0


def test_zero_revocation_rate_gives_the_deterministic_time():
    """Promised exactly (docs/planner.md): every run, the mean and the p95 are the deterministic time."""
    job = JobSpec("toy", 5000, checkpoint_every_steps=500)
    models = toy_models(ScriptedLifetimes(default=math.inf), checkpoint_s=3.0)
    transient = Simulator(job, cluster(("a", 2, True), ("b", 1, True)), models)
    on_demand = Simulator(job, cluster(("a", 2, False), ("b", 1, False)), models)
    s = transient.summarize(20, seed=1)
    np.testing.assert_array_equal([r.wall_time_s for r in transient.run_many(20, seed=1)], on_demand.base_time_s)
    np.testing.assert_array_equal([s.time_mean_s, s.time_p95_s], on_demand.base_time_s)
    assert s.revocations_mean == 0 and s.replacements_mean == 0


def test_checkpoints_pause_the_chief():
    # 1 worker at 1 step/s, a 2 s checkpoint every 100 steps: 10 checkpoints in 1000 steps.
    job = JobSpec("toy", 1000, checkpoint_every_steps=100)
    s = simulate(job, cluster(("a", 1, False), ps=0), toy_models(checkpoint_s=2.0), runs=1)
    assert s.time_mean_s == pytest.approx(1020.0)
    # with 2 equal workers the chief holds half the speed: 1000 steps at 2/s + 10 x 2 s x 1/2
    s2 = simulate(job, cluster(("a", 2, False)), toy_models(checkpoint_s=2.0), runs=1)
    assert s2.time_mean_s == pytest.approx(510.0)


def test_revocation_and_replacement_hand_computed():
    # Both workers (1 step/s each) live 300 s; replacements start 50 s and are requested at 300 s.
    # 0-300: 600 steps; 300-350: none live; 350-: 2 steps/s -> 400 more steps at t=550.
    job = JobSpec("toy", 1000)
    models = toy_models(ScriptedLifetimes({"a": [300, 300, 300, 300, 300, 300]}), startup_s=50.0)
    r = Simulator(job, cluster(("a", 2, True)), models).run_once(np.random.default_rng(0))
    assert r.wall_time_s == pytest.approx(550.0)
    assert (r.revocations, r.replacements, r.steps_lost, r.finished) == (2, 2, 0.0, True)
    # transient 'a' = 0.0005 USD/s: each slot billed 0-300 and 300-550; PS 0.0001 USD/s for 550 s.
    assert r.cost_usd == pytest.approx(2 * 550 * 0.0005 + 550 * 0.0001)


def test_chief_loss_keeps_progress():
    # The chief (slot 0) dies at 100 s and is not replaced: the other worker goes on, nothing is lost.
    job = JobSpec("toy", 1000)
    models = toy_models(ScriptedLifetimes({"a": [100, math.inf, math.inf]}))
    r = Simulator(job, cluster(("a", 2, True), replacement="none"), models).run_once(np.random.default_rng(0))
    assert r.wall_time_s == pytest.approx(100 + 800)
    assert r.steps_lost == 0 and r.revocations == 1 and r.replacements == 0


def test_no_replacement_and_no_workers_left_does_not_finish():
    job = JobSpec("toy", 1000)
    models = toy_models(ScriptedLifetimes({"a": [100]}))
    r = Simulator(job, cluster(("a", 1, True), replacement="none"), models).run_once(np.random.default_rng(0))
    assert not r.finished and r.wall_time_s > 1000


def test_transient_ps_loss_rolls_back_to_the_last_checkpoint():
    # 1 on-demand worker at 1 step/s, checkpoints every 100 steps (free); the PS dies at 260 s:
    # roll back to step 200 (60 lost), new PS up at 310 s, 800 more steps -> 1110 s.
    job = JobSpec("toy", 1000, checkpoint_every_steps=100)
    models = toy_models(ScriptedLifetimes({"cpu": [260]}), startup_s=50.0)
    sim = Simulator(job, cluster(("a", 1, False), ps_transient=True), models)
    r = sim.run_once(np.random.default_rng(0))
    assert r.wall_time_s == pytest.approx(1110.0)
    assert r.steps_lost == pytest.approx(60.0)
    assert (r.revocations, r.replacements) == (1, 1)


def test_cheapest_replacement_switches_type():
    # a=1 step/s, b=2 steps/s at the same spot price: b is half the price per step. 'a' dies at 100 s
    # (300 steps done), a replacement is asked for and joins 10 s later (320 steps): with 'cheapest' it is
    # a 'b' (4 steps/s: 1680 / 4 = 420 s more -> 530 s), with 'same' an 'a' (3 steps/s -> 670 s).
    job = JobSpec("toy", 2000)
    prices = FlatPrices({"a": 3.6, "b": 3.6, "cpu": 0.36}, discount=0.5)
    times = {}
    for policy in ("cheapest", "same"):
        models = dataclasses.replace(toy_models(ScriptedLifetimes({"a": [100]}), startup_s=10.0), prices=prices)
        r = Simulator(job, cluster(("a", 1, True), ("b", 1, True), replacement=policy), models).run_once(
            np.random.default_rng(0))
        assert r.finished and r.replacements == 1
        times[policy] = r.wall_time_s
    assert times == {"cheapest": pytest.approx(530.0), "same": pytest.approx(670.0)}


def test_same_seed_same_result_and_runs_are_prefix_stable():
    job = JobSpec("toy", 20000)
    sim = Simulator(job, cluster(("a", 4, True)), toy_models(ExpLifetimes(3000.0)))
    a = sim.run_many(30, seed=7)
    b = sim.run_many(30, seed=7)
    c = sim.run_many(10, seed=7)
    assert a == b
    assert a[:10] == c
    assert sim.run_many(30, seed=8) != a
    assert sum(r.revocations for r in a) > 0


def test_revocations_slow_and_add_revocations_with_more_workers():
    # With one PS capped at 1.5 steps/s (sublinear scaling, as measured), n workers are exposed for
    # n x T(n) server-seconds, which grows with n; so must the expected revocations.
    # (With memoryless lifetimes and perfectly linear scaling n x T(n) is constant, and only noise
    # would order the means.)
    job = JobSpec("toy", 20000)
    models = toy_models(ExpLifetimes(5000.0), startup_s=120.0, cap_per_ps=1.5)
    means = [Simulator(job, cluster(("a", n, True)), models).summarize(200, 0) for n in (1, 2, 4, 8)]
    revs = [m.revocations_mean for m in means]
    assert revs == sorted(revs)
    for n, m in zip((1, 2, 4, 8), means, strict=True):
        base = 20000 / min(n, 1.5)
        if n < 8:  # revocations only slow down
            assert m.time_mean_s > base
        else:  # the 7 workers left after a loss still reach the PS's cap: revocations cost no time
            assert m.time_mean_s == pytest.approx(base, rel=1e-12)
        assert m.time_p95_s >= m.time_p50_s


def test_bad_specs_raise_user_errors():
    with pytest.raises(UserInputError):
        cluster(("a", 0, True))
    with pytest.raises(UserInputError):
        cluster(("a", 2, True), ps=9)
    with pytest.raises(UserInputError):
        cluster(("a", 2, True), ps=0)
    with pytest.raises(UnknownNameError):
        cluster(("a", 2, True), replacement="sometimes")
    with pytest.raises(UserInputError):
        JobSpec("toy", 0)
    with pytest.raises(UserInputError):
        parse_workers("k80:x", True, "us-east1")
    with pytest.raises(UserInputError):
        parse_workers("k80:0", True, "us-east1")
    with pytest.raises(UserInputError):
        simulate(JobSpec("toy", 10), cluster(("a", 1, False)), toy_models(), runs=0)


def test_parse_workers_mix():
    groups = parse_workers("v100:1, p100:1,k80:2", True, "us-west1")
    assert [(g.gpu, g.count, g.transient, g.region) for g in groups] == [
        ("v100", 1, True, "us-west1"), ("p100", 1, True, "us-west1"), ("k80", 2, True, "us-west1")
    ]


def test_lower_bounds_hold_for_every_run():
    job = JobSpec("toy", 5000, checkpoint_every_steps=250)
    models = toy_models(ExpLifetimes(1500.0), startup_s=200.0, checkpoint_s=1.0, cap_per_ps=2.5)
    for c in (cluster(("a", 3, True)), cluster(("a", 2, True), ("b", 2, True), ps=2),
              cluster(("b", 4, True), ps=1, ps_transient=True)):
        sim = Simulator(job, c, models)
        t_low, c_low = sim.lower_bounds()
        runs = sim.run_many(100, seed=5)
        assert sum(r.revocations for r in runs) > 0
        assert all(r.wall_time_s >= t_low * (1 - 1e-9) and r.cost_usd >= c_low * (1 - 1e-9) for r in runs)


@pytest.mark.parametrize(("gpu", "region"), [("k80", "us-east1"), ("v100", "us-west1"), ("t4", "europe-west4")])
def test_replacement_startup_draws_are_the_startup_models_draws(gpu, region):
    """The planner's replacement start-up (drawn thousands of times per plan, so drawn in one call) is exactly
    the sum of the startup model's per-phase draws from the same stream."""
    from cmdare.plan.adapters import _Startup

    startup = _Startup()
    coast = "west" if "west" in region else "east" if "east" in region else None
    for seed in range(200):
        fast = startup.sample(np.random.default_rng(seed), gpu, True, region)
        phases = startup.model.sample(np.random.default_rng(seed), gpu, True, coast)
        assert fast == float(sum(phases.values()))


def test_events_of_one_instant_decided_at_once_change_no_run(monkeypatch):
    """The simulator hands the controller a Tick and what happened at that instant together (one decision
    pass); handing them one by one, as a driver without batches does, gives the very same runs."""
    from cmdare.plan import sim_driver
    from cmdare.plan.adapters import load_plan_models

    models = load_plan_models("t2t_resnet32", "bathtub")
    cluster = ClusterSpec((WorkerGroup("k80", 12, True, "us-east1"), WorkerGroup("v100", 4, True, "us-east1")),
                          ps=2, region="us-east1", replacement="cheapest")
    sim = Simulator(JobSpec("t2t_resnet32", 2_000_000), cluster, models)

    def runs():
        return [sim.run_traced(np.random.default_rng(seed)) for seed in range(6)]

    batched = runs()

    def one_by_one(self, events):
        self._feed(events)

    monkeypatch.setattr(sim_driver.SimRun, "_feed_at_once", one_by_one)
    single = runs()
    assert [r for r, _ in batched] == [r for r, _ in single]
    assert [[(e.kind, e.time, e.worker_id, e.slot) for e in t] for _, t in batched] == \
        [[(e.kind, e.time, e.worker_id, e.slot) for e in t] for _, t in single]
    assert sum(r.revocations for r, _ in batched) > 0
