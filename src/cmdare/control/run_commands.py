"""What to do, as the run controller decides it: the typed commands
:meth:`~cmdare.control.controller.RunController.handle` returns, in the order a driver carries them out.

A driver acts and reports back with events (:mod:`cmdare.control.run_events`): most commands are done
when issued (a setting pushed, a server killed); those that take time answer with an event of their own
(``StartWorker`` -> ``ServerStarting`` then ``WorkerUp``; ``StartDuty`` -> ``DutyDone``; an action on the
shards -> ``ActionDone``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.kinds import Destination, DutyKind
from cmdare.ps.psld.decisions import Decision

__all__ = [
    "Balance",
    "CancelWorker",
    "ChangePlacement",
    "CloseSpares",
    "Command",
    "EndRun",
    "EvacuatePs",
    "Fence",
    "FillPs",
    "HoldAll",
    "Joined",
    "KillPs",
    "LoseWorker",
    "Note",
    "ParkPs",
    "PsNoticed",
    "Probe",
    "Regroup",
    "ReleaseWorker",
    "Restore",
    "Revoke",
    "SetChief",
    "SetLrScale",
    "SetRoundSize",
    "StartDuty",
    "StartSpare",
    "StartPs",
    "StartWorker",
    "Train",
    "UnparkPs",
]


@dataclass(frozen=True)
class Command:
    """Base of every command. ``why``: the reason the controller decided it, in words (keyword-only, and left out
    of comparisons: two drivers' decisions compare by what they do)."""

    why: str = field(default="", kw_only=True, compare=False)


@dataclass(frozen=True)
class Fence(Command):
    """No push may take the shards past ``step``: every chunk stops there (the next barrier)."""

    step: int


@dataclass(frozen=True)
class Train(Command):
    """Keep worker ``worker_id`` training, chunk after chunk, until the fence (then report it stopped)."""

    worker_id: int


@dataclass(frozen=True)
class HoldAll(Command):
    """Hand out no more chunks; report each worker stopped once its chunks in flight are back (an
    action on quiesced shards follows). ``why`` says what waits."""

    why: str


@dataclass(frozen=True)
class Revoke(Command):
    """Revoke worker ``worker_id``'s (emulated or injected) server now, abruptly."""

    worker_id: int
    source: str = "injected"


@dataclass(frozen=True)
class LoseWorker(Command):
    """Worker ``worker_id`` is no member any more (``reason``: revoked, failed, notice, unresponsive): end
    its server, forget its gradient pieces. ``replaced``: a replacement was asked for."""

    worker_id: int
    reason: str
    replaced: bool
    detected: bool = True


@dataclass(frozen=True)
class ReleaseWorker(Command):
    """Worker ``worker_id`` leaves cleanly after its notice: stop it, end its server."""

    worker_id: int
    reason: str = "notice"


@dataclass(frozen=True)
class StartWorker(Command):
    """Ask for a server of ``spec`` and start worker ``worker_id`` on it for data slot ``slot``
    (``replaces``: the worker it replaces, None for the first wave; ``spare``: the warm spare whose server and
    process become the worker's instead). Answered by ``ServerStarting``."""

    worker_id: int
    slot: int
    spec: ServerSpec
    replaces: int | None = None
    spare: int | None = None


@dataclass(frozen=True)
class StartSpare(Command):
    """Ask for a warm spare ``key``: a server of ``spec`` and a worker process on it that is no member of the run
    (:mod:`cmdare.control.spares`). Answered by ``ServerStarting(spare=key)``, ``SpareUp`` or ``SpareLost``.
    ``first_wave``: asked for with the first wave (its start-up, like the first wave's, is no part of the run)."""

    key: int
    spec: ServerSpec
    first_wave: bool = False


@dataclass(frozen=True)
class CloseSpares(Command):
    """The run asks for no more spares: ``failed_starts`` in a row died before they were up. A report."""

    failed_starts: int


@dataclass(frozen=True)
class Joined(Command):
    """Replacement worker ``worker_id`` joined the run (its server is ready: emulated, simulated or real) in
    place of worker ``replaces``, ``recovery_s`` cloud seconds after that worker was lost. A report."""

    worker_id: int
    replaces: int
    recovery_s: float


@dataclass(frozen=True)
class CancelWorker(Command):
    """Give up the replacement worker ``worker_id`` that did not come (``reason``); ``retried``: its start failed
    for a reason not its own and the same server is asked for again at once (a ``StartWorker`` follows)."""

    worker_id: int
    reason: str
    retried: bool = False


@dataclass(frozen=True)
class SetChief(Command):
    """The chief role moves to ``worker_id`` (None: no worker left); ``announce``: report the handover."""

    worker_id: int | None
    previous: int | None
    announce: bool = True


@dataclass(frozen=True)
class SetLrScale(Command):
    """Multiply the configured learning rate by ``scale`` on every shard (``active`` workers now)."""

    scale: float
    previous: float
    active: int


@dataclass(frozen=True)
class SetRoundSize(Command):
    """Synchronous rounds take ``n`` pushes; ``wait``: until every shard knows (a newcomer pushes next)."""

    n: int
    wait: bool = False


@dataclass(frozen=True)
class StartDuty(Command):
    """The chief ``worker_id`` checkpoints or evaluates (``kind``) the parameters of ``step``. The shards'
    state of ``step`` must be taken before any other worker trains on (a driver that snapshots in the
    background takes it when this command runs). Answered by ``DutyDone``."""

    kind: DutyKind
    worker_id: int
    step: int
    final: bool = False
    reason: str = "schedule"
    #: A checkpoint's: the controller's state to store with it (:meth:`RunController.saved_state`), as JSON text.
    state: str = field(default="", compare=False)


@dataclass(frozen=True)
class StartPs(Command):
    """Start a replacement PS server (an empty shard actor) for the server ``replaces`` leaves; it gets key
    ``key``. Answered by ``ServerStarting`` and ``PsUp``."""

    key: int
    replaces: int


@dataclass(frozen=True)
class PsNoticed(Command):
    """PS server ``key`` got its notice (its revocation comes at ``deadline``): its blocks leave ``onto`` the
    survivors or a replacement at the next boundary (an ``EvacuatePs`` or ``ParkPs`` follows). A report."""

    key: int
    deadline: float
    onto: Destination


@dataclass(frozen=True)
class EvacuatePs(Command):
    """On quiesced shards: move every block of PS server ``key`` onto the other shards (``onto`` is
    ``survivors``) or onto the replacement ``spare`` (``replacement``), then release the server. ``moves``: the
    placement changes that do it, in shard indices (the controller's placement sources decided them: PSLD's drain
    plan, else the least-loaded survivors; onto a spare, an added shard that takes every block); empty where the
    driver keeps no placement (the simulator)."""

    key: int
    onto: Destination
    deadline: float
    spare: int | None = None
    moves: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class ParkPs(Command):
    """On quiesced shards: take the last shard's blocks (server ``key``) into the coordinator and release
    the server before its deadline; training waits for the replacement."""

    key: int
    deadline: float


@dataclass(frozen=True)
class UnparkPs(Command):
    """The replacement ``spare`` is up: it takes the parked blocks of server ``key``."""

    key: int
    spare: int


@dataclass(frozen=True)
class FillPs(Command):
    """On quiesced shards: the replacement PS ``spare`` joins and takes its share of blocks: ``moves``, an added
    shard and the blocks it takes (PSLD's choice, else by bytes; empty where the driver keeps no placement)."""

    spare: int
    moves: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class KillPs(Command):
    """Revoke PS server ``key`` now (``reason``: ``no_notice`` or ``deadline_passed``): its shard dies with
    its updates; a :class:`RestoreShards` follows."""

    key: int
    reason: str


@dataclass(frozen=True)
class Regroup(Command):
    """On quiesced all-reduce members: form the group of ``epoch`` from ``members`` (worker ids, rank order); every
    member takes member ``root``'s training state (parameters, optimizer state, step, data position), or, with
    ``root`` None, the checkpoint of step ``checkpoint`` (None: the state the run started from), when no member
    holds the run's state (a fresh run's first group holds it: each built the same model, ``root`` its first).
    Answered by ``ActionDone('regroup', step=...)`` (the step the group trains on from); ``ok=False`` when a member
    was lost meanwhile, after which the controller decides again."""

    epoch: int
    members: tuple[int, ...]
    root: int | None
    checkpoint: int | None = None
    reason: str | None = None  # with ``root`` None: why the state comes from the checkpoint (``diverged``, ...)


@dataclass(frozen=True)
class Restore(Command):
    """On quiesced shards: each dead shard's server is replaced by a replacement PS server that is up
    (``replacements``: ``(dead server's key, its replacement's key)``), and every shard rolls back to the
    checkpoint of step ``checkpoint``, the newest this run stored (None: the state the run started from, a fresh
    model's or the checkpoint it resumed from; never a checkpoint of another timeline that the storage may hold).
    A rollback after a divergence (``reason`` ``diverged``) takes the workers' batch-norm statistics back too.
    Answered by ``ActionDone('restore', step=...)``; ``ok=False`` with the loss of a shard or a spare the command
    did not know of (``ShardLost``, ``PsStartFailed``), after which the controller decides again."""

    reason: str
    replacements: tuple[tuple[int, int], ...] = ()
    checkpoint: int | None = None

    @property
    def spares(self) -> tuple[int, ...]:
        """The replacement servers' keys, in the order of the dead servers they replace."""
        return tuple(spare for _dead, spare in self.replacements)

    @property
    def dead(self) -> tuple[int, ...]:
        """The dead servers' keys."""
        return tuple(dead for dead, _spare in self.replacements)


@dataclass(frozen=True)
class ChangePlacement(Command):
    """On quiesced shards: carry out placement changes (block moves, shards added or removed); the servers of
    added shards get the keys ``new_keys``, in order."""

    decisions: tuple[Any, ...]
    new_keys: tuple[int, ...] = ()


@dataclass(frozen=True)
class Balance(Command):
    """A balancing step: measure the shards' load now (closing the balancers' window); answered by
    ``ShardLoads(balance=True)``, on which the balancers decide."""

    step: int


@dataclass(frozen=True)
class Note(Command):
    """Something the controller saw worth reporting (``kind``: ``bottleneck``, ``mitigation``, ``new_fleet``;
    ``details``): drivers that keep a record record it."""

    kind: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe(Command):
    """Nothing was heard for a while: ask every worker and shard whether it is alive, and the cluster
    whether it still stands. Answered by ``ProbeDone`` (and loss events)."""

    silent_s: float


@dataclass(frozen=True)
class EndRun(Command):
    """The run ends with ``status`` (``finished`` or ``failed``); ``message`` says why it failed."""

    status: str
    message: str = ""
