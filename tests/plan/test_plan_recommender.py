"""Recommender: enumeration, pruning, deadlines and budgets, and explanations."""

from __future__ import annotations

import pytest
from plan_toys import ExpLifetimes, toy_models

from cmdare.errors import UserInputError
from cmdare.plan.pareto import dominates, pareto_front
from cmdare.plan.recommender import enumerate_clusters, format_duration, recommend
from cmdare.plan.spec import JobSpec


def test_pareto_front():
    pts = [(1.0, 5.0), (2.0, 3.0), (2.0, 4.0), (3.0, 3.0), (4.0, 1.0), (1.0, 5.0)]
    assert pareto_front(pts) == [0, 1, 4]
    assert dominates((1, 1), (1, 2)) and not dominates((1, 1), (1, 1))


def test_enumeration_counts():
    clusters = enumerate_clusters(["a", "b"], ["r1"], max_workers=3, max_ps=2)
    # shapes: a1..a3, b1..b3, mixes (1,1),(1,2),(2,1) -> 9; x2 pricing; PS 1..2, plus ps=0 for n=1
    assert len(clusters) == 2 * (9 * 2 + 2)
    assert {c.ps for c in clusters} == {0, 1, 2}
    assert all(c.n_workers <= 3 for c in clusters)
    with pytest.raises(UserInputError):
        enumerate_clusters(["a"], ["r1"], max_workers=0)


def _plan(**kw):
    job = JobSpec("toy", 20000)
    models = toy_models(ExpLifetimes(20000.0), startup_s=100.0, cap_per_ps=4.0)
    clusters = enumerate_clusters(["a", "b"], ["r1"], max_workers=4, max_ps=2)
    return recommend(job, clusters, models, runs=30, seed=1, **kw), job, models, clusters


def test_pruning_keeps_the_front():
    pruned, job, models, clusters = _plan(prune=True)
    full = recommend(job, clusters, models, runs=30, seed=1, prune=False)
    assert pruned.stats["pruned_dominated"] > 0
    assert [o.cluster for o in pruned.front] == [o.cluster for o in full.front]
    assert pruned.stats["exact_on_demand"] == len([c for c in clusters if not c.any_transient])


def test_deadline_met_picks_the_cheapest_in_time():
    rec, *_ = _plan(deadline_s=8000)
    assert rec.constraint_met
    assert rec.choice.summary.time_mean_s <= 8000
    ok = [o for o in rec.options if o.summary.time_mean_s <= 8000]
    assert rec.choice.summary.cost_mean_usd == min(o.summary.cost_mean_usd for o in ok)
    assert rec.message.startswith("cheapest meeting")


def test_deadline_nobody_meets_names_the_fastest():
    rec, *_ = _plan(deadline_s=600)
    assert not rec.constraint_met
    assert rec.message.startswith("no configuration meets 10 min; fastest is ")
    fastest = min(rec.options, key=lambda o: o.summary.time_mean_s)
    assert rec.choice.summary.time_mean_s == fastest.summary.time_mean_s
    assert rec.front  # the table is not empty


def test_budget_picks_the_fastest_within_it():
    rec, *_ = _plan(budget_usd=12.0)
    assert rec.constraint_met and rec.choice.summary.cost_mean_usd <= 12.0
    ok = [o for o in rec.options if o.summary.cost_mean_usd <= 12.0]
    assert rec.choice.summary.time_mean_s == min(o.summary.time_mean_s for o in ok)
    poor, *_ = _plan(budget_usd=0.001)
    assert not poor.constraint_met and poor.message.startswith("no configuration fits $0.00")


def test_second_ps_is_explained():
    # One PS caps at 4 steps/s; 'b' workers do 2 steps/s each, so 4 of them need a 2nd PS.
    rec, *_ = _plan(deadline_s=2700)
    assert rec.choice.cluster.ps == 2
    assert any(r.startswith("a 2nd PS:") for r in rec.reasons), rec.reasons


def test_bad_constraints():
    job = JobSpec("toy", 100)
    clusters = enumerate_clusters(["a"], ["r1"], 1)
    with pytest.raises(UserInputError, match="future"):
        recommend(job, clusters, toy_models(), deadline_s=-5)
    with pytest.raises(UserInputError, match="negative"):
        recommend(job, clusters, toy_models(), budget_usd=-1)


def test_format_duration():
    assert format_duration(600) == "10 min"
    assert format_duration(5400) == "1h 30m"
    assert format_duration(42) == "42 s"
