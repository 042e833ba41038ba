"""The simulator with cmdare's real models against the published ICAC 2019 end-to-end runs.

ICAC 2019 (Li, Walls, Xu, Guo): ResNet-32 on CIFAR-10, 64k steps, took ~14,080 s and ~$2.83 on one
on-demand K80; 8 preemptible K80 workers + 1 PS were ~7.7x faster for ~60% less money, at whole-VM
rates of $0.723/h (on-demand K80), $0.256/h (preemptible K80) and $0.143/h (CPU PS): the shipped
``icac2019`` catalog override.
"""

from __future__ import annotations

import pytest

from cmdare.plan.adapters import load_plan_models
from cmdare.plan.simulator import Simulator, simulate
from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup

PUBLISHED_1K80_S = 14080.0
PUBLISHED_1K80_USD = 2.83
PUBLISHED_8K80_S = PUBLISHED_1K80_S / 7.7
PUBLISHED_8K80_USD = PUBLISHED_1K80_USD * (1 - 0.60)
JOB = JobSpec("resnet32", 64000)


@pytest.fixture(scope="module")
def models():
    return load_plan_models("resnet32", "bathtub", catalog="icac2019")


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


def test_more_transient_workers_never_lower_expected_revocations(models):
    revs = [
        Simulator(JOB, k80s(n, True, 1), models).summarize(300, seed=2).revocations_mean for n in range(1, 9)
    ]
    assert all(b >= a for a, b in zip(revs, revs[1:], strict=False)), revs
    assert revs[-1] > 0


def test_zero_revocation_rate_gives_the_deterministic_time():
    never = load_plan_models("resnet32", "none", catalog="icac2019")
    sim = Simulator(JOB, k80s(8, True, 1), never)
    s = sim.summarize(50, seed=3)
    on_demand = Simulator(JOB, k80s(8, False, 1), never).base_time_s
    assert s.time_mean_s == pytest.approx(on_demand) and s.time_p95_s == pytest.approx(on_demand)
    assert s.revocations_mean == 0
