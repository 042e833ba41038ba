"""The public API: each package's ``__all__``, pinned, and every name in it importable.

A change to a package's exports must change this file too; the internal packages listed in
:data:`UNPINNED` have no ``__all__`` on purpose.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

PINNED: dict[str, list[str]] = {
    "cmdare": ["__version__"],
    "cmdare.cloud": [
        "Catalog", "GpuType", "LocalMetadataServer", "NotOfferedError", "Notice", "NoticeWatcher", "Offering",
        "ServerSpec", "cost_usd", "gpu_tflops", "load_catalog",
    ],
    "cmdare.datasets": [
        "BatchStream", "Dataset", "DatasetSpec", "GroupBatches", "MapSamples", "epoch_permutation", "fit_images",
        "list_datasets", "load_dataset", "register_dataset",
    ],
    "cmdare.events": [
        "CheckpointReport", "EVENT_KINDS", "EvalReport", "EventReport", "RunInfo", "RunSummary", "ShardReport",
        "StepReport", "TrainCallback", "is_replacement", "is_revocation",
    ],
    "cmdare.measure": [
        "LIFETIME_MODELS", "LifetimeModel", "REPORTS", "Store", "StoreRecorder", "TensorBoardCallback", "build_report",
        "load_lifetime_model", "open_store",
    ],
    "cmdare.measure.reports": ["FORMATS", "REPORTS", "Report", "build_report"],
    "cmdare.measure.store": ["Store", "migrate", "open_store"],
    "cmdare.plan": [
        "AddShard", "BottleneckKind", "ClusterSpec", "Diagnosis", "JobSpec", "NoAction", "PlanModels", "Rebalance",
        "ReplaceWorker", "RunResult", "SimSummary", "WorkerGroup", "decide_mitigation", "diagnose", "load_plan_models",
        "pareto_front", "parse_workers", "recommend", "simulate",
    ],
    "cmdare.predict": [
        "PS_MODEL_LINK_GBPS", "WorkloadFeatures", "checkpoint_model", "cluster_speed_model", "fit_from_store",
        "gpu_tflops", "list_published_workloads", "predict_checkpoint_s", "predict_cluster_steps_per_s",
        "predict_step_time_s", "published_workload", "recovery_time_published_s", "recovery_time_s", "startup_model",
        "step_flops", "step_time_model",
    ],
    "cmdare.collective": ["ElasticGroup", "GradientBuckets", "PeerLost", "Rendezvous"],
    "cmdare.ps": [
        "Block", "OptimizerConfig", "ParamInfo", "Placement", "PlacementStrategy", "get_placement",
        "register_placement", "split_blocks",
    ],
    "cmdare.ps.psld": [
        "AddShard", "BlockLoad", "CostModel", "Decision", "Move", "NoChange", "Plan", "PsldBalancer", "RemoveShard",
        "ShardCost", "ShardDiagnosis", "ShardLoad", "ShardState", "apply_decisions", "block_costs", "diagnose",
        "moved_bytes", "plan_drain", "plan_rebalance", "predict_after", "shard_costs",
    ],
    "cmdare.control": [
        "AllReduceTopology", "CHIEF_POLICIES", "ChiefChange", "ChiefPolicy", "Decision", "DutySchedule",
        "EmulatedClock", "Evacuate",
        "LR_POLICIES", "LifetimeRevocations", "LongestServing", "LrChange", "LrPolicy", "Membership",
        "MembershipEvent", "MembershipKernel", "NoReplace", "NoRevocations", "NoWorkersLeft", "Offer",
        "PendingReplacement", "PeriodicRevocations", "PsServerInfo", "PsServerKernel", "PsTopology", "Quiesce",
        "REPLACEMENT_POLICIES",
        "REVOCATION_SOURCES", "Registry", "Replace", "ReplacementPolicy", "RequestPsReplacement",
        "RequestReplacement", "RestoreShards", "RevocationPlan", "RevocationSource", "RunConfig", "RunController",
        "RunState", "Topology", "TraceRevocations", "WorkerInfo", "build_revocation_source",
    ],
    "cmdare.public_data": [
        "BUNDLED_DIR", "DATA_ENV", "LIFETIME_FILES", "PUBLIC_SOURCES", "is_bundled", "lifetime_files",
        "public_data_dir",
    ],
    "cmdare.tasks": ["Evaluation", "Task", "build_task", "check_part", "is_builtin_dataset", "part_name"],
    "cmdare.storage": ["MissingObjectError", "Storage", "as_storage", "run_storage", "storage_options", "storage_root"],
    "cmdare.train": ["OptimizerConfig", "TrainCallback", "TrainSpec", "Trainer", "train"],
    "cmdare.train.callbacks": [
        "CheckpointReport", "EVENT_KINDS", "EvalReport", "EventReport", "RunInfo", "RunSummary", "ShardReport",
        "StepReport", "TrainCallback", "is_replacement", "is_revocation",
    ],
    "cmdare.workloads": [
        "ModelSpec", "WorkloadProfile", "build_model", "count_flops_forward", "describe_model", "list_models",
        "profile_model", "register_model", "unregister_model",
    ],
}

# Pinned modules that are not packages: the report types' home and their public place.
PINNED_MODULES = {"cmdare.events", "cmdare.train.callbacks"}

# Packages deliberately not pinned: internal (no __all__).
UNPINNED = {
    # cmdare.train's parts (its API is cmdare.train's): the command line, the run, the workers, the shards, the duties
    # and what they all use at run time
    "cmdare.train.allreduce",
    "cmdare.train.cli",
    "cmdare.train.duties",
    "cmdare.train.ps",
    "cmdare.train.run",
    "cmdare.train.runtime",
    "cmdare.train.workers",
    "cmdare.measure.importers",
    "cmdare.measure.store.migrations",
    "cmdare.measure.store.migrations.versions",
}


def _packages() -> set[str]:
    return {".".join(p.parent.relative_to(SRC).parts) for p in (SRC / "cmdare").rglob("__init__.py")}


def test_every_package_is_pinned_or_listed() -> None:
    packages = _packages()
    assert sorted(packages - set(PINNED) - UNPINNED) == [], "pin these packages' __all__ (or list them in UNPINNED)"
    assert sorted(set(PINNED) - packages - PINNED_MODULES) == [], "pinned packages that no longer exist"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_all_is_pinned(name: str) -> None:
    expected = PINNED[name]
    exported = importlib.import_module(name).__all__
    assert len(exported) == len(set(exported)), f"{name}.__all__ has duplicates"
    assert sorted(exported) == expected


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_exported_name_imports(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def test_reexports_are_the_same_objects() -> None:
    import cmdare.events as events
    import cmdare.train.callbacks as callbacks

    for n in events.__all__:
        assert getattr(callbacks, n) is getattr(events, n)
