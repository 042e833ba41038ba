"""The public API of cmdare.plan is pinned."""

from __future__ import annotations

import cmdare.plan as plan

EXPECTED = {
    "AddShard", "BottleneckKind", "ClusterSpec", "Diagnosis", "JobSpec", "NoAction", "PlanModels",
    "Rebalance", "ReplaceWorker", "RunResult", "SimSummary", "WorkerGroup", "decide_mitigation",
    "diagnose", "load_plan_models", "pareto_front", "parse_workers", "recommend", "simulate",
}


def test_public_api_is_pinned():
    assert set(plan.__all__) == EXPECTED
    for name in plan.__all__:
        assert getattr(plan, name) is not None
    assert callable(plan.simulate) and callable(plan.recommend) and callable(plan.load_plan_models)
