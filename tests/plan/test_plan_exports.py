"""The public API of cmdare.plan is pinned."""

from __future__ import annotations

import importlib

import cmdare.plan as plan

EXPECTED = {
    "AddShard", "BottleneckKind", "ClusterSpec", "Diagnosis", "JobSpec", "NoAction", "PlanModels",
    "Rebalance", "ReplaceWorker", "RunResult", "SimSummary", "WorkerGroup", "decide_mitigation",
    "diagnose", "load_plan_models", "pareto_front", "parse_workers", "recommend", "simulate",
}


def test_public_api_is_pinned():
    assert set(plan.__all__) == EXPECTED
    for name in plan.__all__:  # each name is the object defined in its home module (not a copy or a shim)
        obj = getattr(plan, name)
        assert obj is getattr(importlib.import_module(plan._HOMES[name]), name) and obj.__module__ == plan._HOMES[name]
    assert callable(plan.simulate) and callable(plan.recommend) and callable(plan.load_plan_models)


def test_every_export_has_a_home_and_import_stays_light():
    import subprocess
    import sys

    assert set(plan._HOMES) == set(plan.__all__)
    code = "import sys, cmdare.plan.commands; print('numpy' in sys.modules, 'simpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
