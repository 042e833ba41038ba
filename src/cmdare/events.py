"""Run reports and the callback base class: what a training run tells its observers.

Plain frozen dataclasses (picklable, so a callback can run in another process) and
:class:`TrainCallback`, whose hooks do nothing until overridden. They sit below every layer so
measurement (:mod:`cmdare.measure`) can consume them without importing :mod:`cmdare.train`, which
re-exports them from :mod:`cmdare.train.callbacks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EVENT_KINDS",
    "is_replacement",
    "is_revocation",
    "CheckpointReport",
    "EvalReport",
    "EventReport",
    "RunInfo",
    "RunSummary",
    "ShardReport",
    "StepReport",
    "TrainCallback",
]


@dataclass(frozen=True)
class RunInfo:
    """What a run is: its id and configuration, written once when it starts."""

    run_id: str
    config: dict[str, Any]
    started_at: float  # unix seconds
    code_version: str = ""
    emulated: bool = False  # True when GPU types/speeds are emulated locally
    resumed_from_step: int = 0


@dataclass(frozen=True)
class StepReport:
    """Progress of one worker over one chunk of steps, as seen by the coordinator."""

    run_id: str
    time: float  # unix seconds at the end of the chunk
    global_step: int
    worker_id: int
    steps: int  # steps this worker pushed in the chunk
    duration_s: float  # wall time of the chunk on the worker
    loss: float
    cluster_steps_per_s: float  # global steps/s over the coordinator's recent window
    compute_s: float = 0.0  # forward+backward time inside the chunk
    comm_s: float = 0.0  # push+pull wait inside the chunk
    staleness: tuple[int, ...] = ()  # per push: global steps since the pulled parameters

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class ShardReport:
    """Load of one parameter shard since its previous report."""

    run_id: str
    time: float
    global_step: int
    shard_id: int
    pushes: int
    bytes_in: int
    bytes_out: int
    busy_s: float  # time serving pushes: update, emulated link, injected slowdown
    num_params: int = 0
    apply_s: float = 0.0  # part of busy_s in the optimizer update
    queue_s: float = 0.0  # summed over pushes: worker's send to the start of service
    wait_s: float = 0.0  # summed over pushes: worker-observed send-to-reply time
    blocks: tuple[Any, ...] = ()  # per block on this shard: cmdare.ps.psld.BlockLoad


@dataclass(frozen=True)
class EvalReport:
    """Test-set evaluation by the chief."""

    run_id: str
    time: float
    global_step: int
    worker_id: int
    accuracy: float | None  # None where the task measures no accuracy (your own data)
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)  # every metric of the task, accuracy included


@dataclass(frozen=True)
class CheckpointReport:
    """One checkpoint, reported once durable in the run's storage.

    ``duration_s`` runs from the checkpoint duty's start to the stored manifest; ``stall_s`` is what
    training waited for: the chief's snapshot of the shards (the upload runs in the background).
    """

    run_id: str
    time: float
    global_step: int
    worker_id: int
    path: str
    size_bytes: int
    duration_s: float
    num_tensors: int = 0
    stall_s: float = 0.0


@dataclass(frozen=True)
class EventReport:
    """Something that happened to the cluster: revocation, notice, replacement, chief change, ...

    ``kind`` is one of :data:`EVENT_KINDS`; ``details`` holds kind-specific fields (JSON-able).
    """

    run_id: str
    time: float
    kind: str
    global_step: int = 0
    worker_id: int | None = None
    shard_id: int | None = None
    server_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def is_revocation(kind: str, details: dict[str, Any] | None = None) -> bool:
    """Whether an event of ``kind`` counts as one server revoked: a revocation (injected or a failure), a
    worker's or a PS server's notice, a PS server killed without notice. The run's summary and ``cmdare report
    run`` count with this one rule (a loss the revocation caused is the same revocation, not another)."""
    if kind in ("revocation", "notice", "ps_notice"):
        return True
    return kind == "ps_revocation" and not (details or {}).get("noticed")


def is_replacement(kind: str) -> bool:
    """Whether an event of ``kind`` is a replacement server joining the run (a worker or a PS server)."""
    return kind in ("replacement_joined", "ps_replacement_joined")


EVENT_KINDS = (
    "run_start",
    "server_requested",
    "server_joined",
    "server_ended",
    "run_end",
    "revocation",
    "notice",
    "worker_lost",
    "replacement_requested",
    "replacement_joined",
    "chief_change",
    "checkpoint",
    "checkpoint_failed",
    "storage_warning",
    "resume",
    "shard_lost",
    "shard_restored",
    "ps_move",
    "ps_add",
    "ps_remove",
    "lr_change",
    "bottleneck",
    "mitigation",
    "run_state",
)


@dataclass(frozen=True)
class RunSummary:
    """How a run ended."""

    run_id: str
    time: float
    status: str  # "finished", "failed", "interrupted"
    global_step: int
    wall_s: float
    steps_per_s: float
    final_accuracy: float | None
    final_loss: float | None
    revocations: int = 0
    replacements: int = 0
    cost_usd: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


class TrainCallback:
    """Base class: override the hooks you need. Hooks run on the coordinator, in order."""

    def on_run_start(self, info: RunInfo) -> None:
        """Called once before the first step (also on resume)."""

    def on_step(self, report: StepReport) -> None:
        """Called after each worker chunk."""

    def on_shard(self, report: ShardReport) -> None:
        """Called when shard load counters are collected."""

    def on_eval(self, report: EvalReport) -> None:
        """Called after each chief evaluation."""

    def on_checkpoint(self, report: CheckpointReport) -> None:
        """Called after each checkpoint."""

    def on_event(self, report: EventReport) -> None:
        """Called for cluster events (revocations, replacements, moves, ...)."""

    def on_run_end(self, summary: RunSummary) -> None:
        """Called once when the run ends, whatever the outcome."""
