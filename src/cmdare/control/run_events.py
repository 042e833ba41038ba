"""What happened, as the run controller hears it: the typed events a driver feeds to
:meth:`~cmdare.control.controller.RunController.handle`.

Every event carries ``wall``, the driver's own clock (wall seconds on Ray, simulated seconds in SimPy),
which the controller uses only for deadlines on real waits (a process that does not come up, a run that
makes no progress). Cloud time, the time lifetimes, start-ups and notices are counted in, is ``now`` where
the driver keeps it (the simulator; a run on a real cluster); an emulated run leaves ``now`` out and the
controller derives cloud time from the training progress the events report
(:class:`~cmdare.control.emulated_clock.EmulatedClock`).

Identities: a worker is its ``worker_id`` (the controller hands them out); a parameter-server *server* is its
key (negative, :class:`~cmdare.control.ps_servers.PsServerInfo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmdare.control.kinds import DutyKind, ShardAction

__all__ = [
    "ActionDone",
    "AllStopped",
    "CheckpointFailed",
    "CheckpointStored",
    "ChunkDone",
    "ChunkFailed",
    "ClusterLost",
    "CodeFailed",
    "DutyDone",
    "Event",
    "GroupBroken",
    "PlacementRequested",
    "ProbeDone",
    "PsNotice",
    "PsStartFailed",
    "PsUp",
    "ServerStarting",
    "ShardLoads",
    "ShardLost",
    "SpareLost",
    "SpareUp",
    "StopRequested",
    "Tick",
    "WorkerAtRisk",
    "WorkerNotice",
    "WorkerStartFailed",
    "WorkerStopped",
    "WorkerUp",
]


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event: the driver's clock and, where the driver keeps it, cloud time."""

    wall: float
    now: float | None = None


@dataclass(frozen=True, kw_only=True)
class Tick(Event):
    """Time passed (the driver wakes the controller at :meth:`RunController.next_wakeup` at the latest);
    ``global_step``: the step training has reached, where the driver knows it (the simulator)."""

    global_step: float | None = None


@dataclass(frozen=True, kw_only=True)
class ChunkDone(Event):
    """A chunk of ``steps`` steps of worker ``worker_id`` ended at ``global_step`` (the shards' step after
    its last push); ``refused``: the shards refused its last push (the fence or the target step); ``loss``:
    the chunk's training loss, where the driver knows it; ``params_finite``: False when the worker found
    non-finite parameters; ``diverged_at``: the global step of the parameters with which the worker first met a
    non-finite loss (it pushed nothing from then on). A diverged chunk acts per ``--on-diverge``
    (:mod:`cmdare.control.divergence`)."""

    worker_id: int
    global_step: float
    steps: int = 0
    refused: bool = False
    loss: float | None = None
    params_finite: bool = True
    diverged_at: int | None = None
    duration_s: float = 0.0  # the chunk's wall time, and the part of it its worker spent computing (where measured)
    compute_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class WorkerStopped(Event):
    """Worker ``worker_id`` has no chunk in flight any more (it reached the fence, or was held)."""

    worker_id: int
    global_step: float


@dataclass(frozen=True, kw_only=True)
class AllStopped(Event):
    """Every worker that was training has stopped at ``global_step`` (the fence): one event for all of them
    (the simulator, whose workers all reach the fence at one moment)."""

    global_step: float


@dataclass(frozen=True, kw_only=True)
class WorkerNotice(Event):
    """Worker ``worker_id``'s server got a preemption notice (cloud metadata or Ray's drain); it stopped
    training. ``deadline`` in cloud time, None when unknown."""

    worker_id: int
    provider: str = "unknown"
    deadline: float | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerAtRisk(Event):
    """Worker ``worker_id``'s server is at elevated risk of interruption (an AWS rebalance recommendation, which can
    come well before the interruption notice); it trains on."""

    worker_id: int
    provider: str = "aws"


@dataclass(frozen=True, kw_only=True)
class ChunkFailed(Event):
    """A call on worker ``worker_id`` failed: its actor or node died (``shard_lost`` False), or a shard it
    talked to died (``shard_lost`` True)."""

    worker_id: int
    shard_lost: bool = False
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class GroupBroken(Event):
    """An all-reduce group's collective failed for member ``worker_id`` (``detail``) while every member still
    answers: the group must be formed again (a member that died or froze is reported as a :class:`ChunkFailed`)."""

    worker_id: int
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class CodeFailed(Event):
    """The code worker ``worker_id`` ran failed while it trained or evaluated, its server alive: the user's (its
    data, model, loss or metric raised; ``error`` is the one line naming the part and the step) or cmdare's own.
    Any worker would fail the same way: the run ends with that line, nothing taken for a revocation (a chief whose
    evaluation failed so was replaced, and its replacement, for ever)."""

    worker_id: int
    error: str


@dataclass(frozen=True, kw_only=True)
class ServerStarting(Event):
    """The driver asked for the server of worker ``worker_id`` (or of PS key ``key``, or of warm spare ``spare``):
    it is ready ``startup_s`` cloud seconds from now (an emulated start-up), or, with None, when its process is
    up."""

    worker_id: int | None = None
    key: int | None = None
    spare: int | None = None
    startup_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerUp(Event):
    """Worker ``worker_id``'s process is up (constructed, holding the data and the model)."""

    worker_id: int


@dataclass(frozen=True, kw_only=True)
class WorkerStartFailed(Event):
    """Worker ``worker_id`` did not start: ``deterministic`` when its own code failed (its constructor
    raised: any replacement would fail the same way), else its server or node went away while starting."""

    worker_id: int
    error: str
    deterministic: bool = False


@dataclass(frozen=True, kw_only=True)
class SpareUp(Event):
    """Warm spare ``key``'s process is up (warm: it has imported, read the data and built the model)."""

    key: int


@dataclass(frozen=True, kw_only=True)
class SpareLost(Event):
    """Warm spare ``key`` died (its server went away, or its process), before or after it was up."""

    key: int
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class PsNotice(Event):
    """PS server ``key`` gets a preemption notice now (Ray's drain of its node); revoked at ``deadline``."""

    key: int
    deadline: float


@dataclass(frozen=True, kw_only=True)
class PsUp(Event):
    """The replacement PS server ``key`` answers (its shard actor is up, empty)."""

    key: int


@dataclass(frozen=True, kw_only=True)
class PsStartFailed(Event):
    """The replacement PS server ``key`` died before it answered."""

    key: int
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ShardLost(Event):
    """Parameter shards died (a push, a snapshot or a stats call failed on one): ``keys`` are their servers
    (empty when the driver could not tell which)."""

    keys: tuple[int, ...] = ()
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class DutyDone(Event):
    """The chief's duty ``kind`` (``checkpoint`` or ``eval``) at ``step`` ended: ``ok``, or it failed
    because the chief died (``shard_lost`` False) or a shard did (True); ``loss``: an evaluation's test loss
    (None: none, or no test data)."""

    kind: DutyKind
    worker_id: int
    step: int
    ok: bool = True
    shard_lost: bool = False
    error: str = ""
    loss: float | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointStored(Event):
    """The checkpoint of ``step`` is durable in the run's storage."""

    step: int


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed(Event):
    """The checkpoint of ``step`` could not be stored (the previous one stays the latest)."""

    step: int
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ActionDone(Event):
    """An action on quiesced shards ended (``evacuate``, ``park``, ``unpark``, ``fill``, ``restore``,
    ``placement``). ``step``: the step training continues from (a restore's checkpoint step).
    ``num_shards``: how many shards hold blocks afterwards; ``removed_keys``: the servers of shards a placement
    change removed; ``migrations``: the block moves carried out, each ``(decisions done, bytes moved, pause
    seconds)``; ``placement``: the placement afterwards (where the driver keeps one)."""

    action: ShardAction
    ok: bool = True
    step: int | None = None
    num_shards: int | None = None
    removed_keys: tuple[int, ...] = ()
    migrations: tuple[tuple[tuple[Any, ...], int, float], ...] = ()
    placement: Any = None
    details: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class PlacementRequested(Event):
    """Placement changes asked for from outside the run: ``requests`` (``cmdare ps add|remove``: ``{"action": ...,
    "shard": ...}``, turned into decisions against the placement as it is), or ready ``decisions``."""

    decisions: tuple[Any, ...] = ()
    requests: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, kw_only=True)
class ShardLoads(Event):
    """The shards' load since the last measurement (``stats``: one ``ShardStats`` per shard) and the placement
    (a :class:`~cmdare.ps.placement.Placement`) at ``global_step``; ``balance``: the answer to a ``Balance``
    command (the balancers decide now); else a periodic measurement they only observe. Drivers that measure no
    shards (the simulator) answer a ``Balance`` with empty ``stats`` and no placement."""

    global_step: float | None = None
    stats: tuple[Any, ...] = ()
    placement: Any = None
    balance: bool = False


@dataclass(frozen=True, kw_only=True)
class StopRequested(Event):
    """The user asked the run to stop (Ctrl-C, SIGTERM, the Python API): it stops at the next step boundary,
    stores a checkpoint of that step and ends ``interrupted``; ``why`` says what asked (``interrupted (SIGINT)``)."""

    why: str = "interrupted"


@dataclass(frozen=True, kw_only=True)
class ProbeDone(Event):
    """The answer to :class:`~cmdare.control.run_commands.Probe`: every worker and shard answered (``ok``),
    or the probe found losses, which come as their own events."""

    ok: bool = True


@dataclass(frozen=True, kw_only=True)
class ClusterLost(Event):
    """The cluster itself is gone (e.g. the local Ray node was marked dead): nothing can go on."""

    message: str
