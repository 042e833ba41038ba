"""The simulator with cmdare's real models against the published ICAC 2019 end-to-end runs.

ICAC 2019 (Li, Walls, Xu, Guo): ResNet-32 on CIFAR-10, 64k steps, took ~14,080 s and ~$2.83 on one
on-demand K80; 8 preemptible K80 workers + 1 PS were ~7.7x faster for ~60% less money, at whole-VM
rates of $0.723/h (on-demand K80), $0.256/h (preemptible K80) and $0.143/h (CPU PS): the shipped
``icac2019`` catalog override.
"""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.plan.adapters import load_plan_models
from cmdare.plan.simulator import Simulator, simulate
from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup

PUBLISHED_1K80_S = 14080.0
PUBLISHED_1K80_USD = 2.83
PUBLISHED_8K80_S = PUBLISHED_1K80_S / 7.7
PUBLISHED_8K80_USD = PUBLISHED_1K80_USD * (1 - 0.60)
JOB = JobSpec("t2t_resnet32", 64000, batch_size=128)  # ICAC 2019 trained at Tensor2Tensor's batch of 128


@pytest.fixture(scope="module")
def models():
    return load_plan_models("t2t_resnet32", "bathtub", catalog="icac2019", batch_size=JOB.batch_size)


def k80s(n: int, transient: bool, ps: int) -> ClusterSpec:
    return ClusterSpec((WorkerGroup("k80", n, transient, "us-east1"),), ps=ps, region="us-east1")


def test_one_on_demand_k80_within_15_percent(models):
    s = simulate(JOB, k80s(1, False, 0), models, runs=200, seed=1)
    assert s.time_mean_s == pytest.approx(PUBLISHED_1K80_S, rel=0.15)
    assert s.cost_mean_usd == pytest.approx(PUBLISHED_1K80_USD, rel=0.15)


def test_eight_preemptible_k80_within_15_percent(models):
    s = simulate(JOB, k80s(8, True, 1), models, runs=200, seed=1)
    assert s.time_mean_s == pytest.approx(PUBLISHED_8K80_S, rel=0.15)
    assert s.cost_mean_usd == pytest.approx(PUBLISHED_8K80_USD, rel=0.15)
    assert s.time_p95_s >= s.time_p50_s >= s.extra["deterministic_time_s"] * 0.999999


def _revocations(models, n: int, runs: int, seed: int) -> tuple[float, float]:
    revs = np.array([r.revocations for r in Simulator(JOB, k80s(n, True, 1), models).run_many(runs, seed)], float)
    return float(revs.mean()), float(revs.std(ddof=1) / np.sqrt(revs.size))


def test_more_transient_workers_never_lower_expected_revocations(models):
    # K80 with one PS scales almost linearly, so n x T(n) server-seconds barely grow and neighbouring
    # means differ by less than their Monte Carlo error: assert no decrease beyond 3 standard errors
    # between neighbours (2,000 runs each), and a significant increase from 1 to 8 workers (8,000 runs
    # each; 4.4-6.8 standard errors over seeds 0-5).
    stats = [_revocations(models, n, 2000, seed=2) for n in range(1, 9)]
    for (m0, e0), (m1, e1) in zip(stats, stats[1:], strict=False):
        assert m1 >= m0 - 3 * np.hypot(e0, e1), stats
    (m1, e1), (m8, e8) = _revocations(models, 1, 8000, seed=0), _revocations(models, 8, 8000, seed=0)
    assert m8 - m1 > 3 * np.hypot(e1, e8), (m1, m8)


def test_zero_revocation_rate_gives_the_deterministic_time():
    """Promised exactly (docs/planner.md), with the real models and ``--lifetime none``."""
    never = load_plan_models("t2t_resnet32", "none", catalog="icac2019", batch_size=JOB.batch_size)
    sim = Simulator(JOB, k80s(8, True, 1), never)
    s = sim.summarize(50, seed=3)
    on_demand = Simulator(JOB, k80s(8, False, 1), never).base_time_s
    np.testing.assert_array_equal([s.time_mean_s, s.time_p95_s, s.extra["deterministic_time_s"]], on_demand)
    assert s.revocations_mean == 0


def test_p100_plan_explains_the_second_ps(models):
    from cmdare.plan.recommender import enumerate_clusters, recommend

    clusters = enumerate_clusters(["p100"], ["us-east1"], max_workers=8, max_ps=2)
    rec = recommend(JOB, clusters, models, deadline_s=20 * 60, runs=50, seed=0)
    assert rec.constraint_met and rec.choice.cluster.ps == 2
    ps_reason = next(r for r in rec.reasons if r.startswith("a 2nd PS:"))
    assert "P100 workers saturate one PS at 4-5 workers" in ps_reason


def test_unbounded_plans_are_refused_in_one_line(models):
    """Issue 29: plan --steps 1e15 and plan simulate --workers k80:100000 ran for minutes and gigabytes."""
    from cmdare.errors import UserInputError
    from cmdare.plan.recommender import enumerate_clusters, evaluate

    with pytest.raises(UserInputError, match="a cluster has at most 1024 workers, got 100000"):
        k80s(100_000, True, 1)
    huge = JobSpec("t2t_resnet32", 10**15)
    with pytest.raises(UserInputError, match=r"10{15} steps take \d+ days on 8xK80 .*beyond the simulator's 365 days"):
        simulate(huge, k80s(8, True, 1), models, runs=5)
    assert Simulator(huge, k80s(8, False, 1), models).summarize(3, 0).time_mean_s > 365 * 86400  # exact: no runs
    options, stats = evaluate(huge, [k80s(8, True, 1), k80s(8, False, 1)], models, runs=5)
    assert stats["beyond_horizon"] == 1 and [o.cluster.workers[0].transient for o in options] == [False]
    with pytest.raises(UserInputError, match="max workers must be at least 1 and at most 64, got 10000"):
        enumerate_clusters(["k80"], ["us-east1"], max_workers=10_000)
