"""cmdare.plan: which cluster to rent, and what limits a running one.

- :mod:`~cmdare.plan.spec`: job and cluster specs, the model protocols, run results;
- :mod:`~cmdare.plan.simulator`: SimPy Monte Carlo simulation of a job under revocations;
- :mod:`~cmdare.plan.recommender`: enumerate, simulate (with pruning), Pareto front, choice and reasons;
- bottleneck diagnosis and mitigation decisions (re-exported from :mod:`cmdare.control.bottleneck`, the
  control kernel, which the live trainer uses too);
- :mod:`~cmdare.plan.adapters`: the protocols over cmdare.predict, cmdare.measure and cmdare.cloud.

Every name loads on first use (numpy, SimPy and the fitted models stay out of ``cmdare --help``).
"""

from __future__ import annotations

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


_HOMES = {
    **dict.fromkeys(
        ["AddShard", "BottleneckKind", "Diagnosis", "NoAction", "Rebalance", "ReplaceWorker",
         "decide_mitigation", "diagnose"], "cmdare.control.bottleneck"),
    **dict.fromkeys(
        ["ClusterSpec", "JobSpec", "PlanModels", "RunResult", "SimSummary", "WorkerGroup", "parse_workers"],
        "cmdare.plan.spec"),
    "pareto_front": "cmdare.plan.pareto",
    "simulate": "cmdare.plan.simulator",
    "recommend": "cmdare.plan.recommender",
    "load_plan_models": "cmdare.plan.adapters",
}


def __getattr__(name: str):
    # Everything loads on first use, so `cmdare --help` (which imports cmdare.plan.commands) stays fast.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cmdare.plan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
