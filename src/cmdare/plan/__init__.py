"""cmdare.plan: which cluster to rent, and what limits a running one.

- :mod:`~cmdare.plan.spec`: job and cluster specs, the model protocols, run results;
- :mod:`~cmdare.plan.simulator`: SimPy Monte Carlo simulation of a job under revocations;
- :mod:`~cmdare.plan.recommender`: enumerate, simulate (with pruning), Pareto front, choice and reasons;
- :mod:`~cmdare.plan.bottleneck`: pure bottleneck diagnosis and mitigation decisions for live runs;
- :mod:`~cmdare.plan.adapters`: the protocols over cmdare.predict, cmdare.measure and cmdare.cloud.

Heavy dependencies (SimPy, the fitted models) load only when these names are used.
"""

from __future__ import annotations

from cmdare.plan.bottleneck import (
    AddShard,
    BottleneckKind,
    Diagnosis,
    NoAction,
    Rebalance,
    ReplaceWorker,
    decide_mitigation,
    diagnose,
)
from cmdare.plan.pareto import pareto_front
from cmdare.plan.spec import (
    ClusterSpec,
    JobSpec,
    PlanModels,
    RunResult,
    SimSummary,
    WorkerGroup,
    parse_workers,
)

__all__ = [
    "AddShard",
    "BottleneckKind",
    "ClusterSpec",
    "Diagnosis",
    "JobSpec",
    "NoAction",
    "PlanModels",
    "Rebalance",
    "ReplaceWorker",
    "RunResult",
    "SimSummary",
    "WorkerGroup",
    "decide_mitigation",
    "diagnose",
    "load_plan_models",
    "pareto_front",
    "parse_workers",
    "recommend",
    "simulate",
]


def __getattr__(name: str):
    # simpy and the fitted models load on first use, keeping `import cmdare.plan` light.
    if name == "simulate":
        from cmdare.plan.simulator import simulate

        return simulate
    if name == "recommend":
        from cmdare.plan.recommender import recommend

        return recommend
    if name == "load_plan_models":
        from cmdare.plan.adapters import load_plan_models

        return load_plan_models
    raise AttributeError(f"module 'cmdare.plan' has no attribute {name!r}")
