"""Parameter servers on transient servers: when each is noticed and revoked, and what a notice decides.

A PS server on a spot VM is revoked by the same revocation source as the workers (one stream over
every transient server; ``hit=`` in the spec narrows it). Each revocation comes ``notice_s`` after
its notice (0: none). The policy decides, drivers act (the Ray trainer and the SimPy simulator):

* :class:`Evacuate` ``onto="survivors"``: other shards are left: at the next iteration boundary the
  shard's blocks (parameters and optimizer state) move to them and its server is released before the
  deadline; a replacement PS (:class:`RequestPsReplacement`) is filled (rebalanced) once it is up;
* :class:`Evacuate` ``onto="replacement"``: it is the last shard: a replacement starts now and every
  block moves to it once it is up, if that is before the deadline;
* :class:`RestoreShards`: no notice, or the deadline came first: the shard dies with its updates and
  every shard rolls back to the latest checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cmdare.cloud.servers import ServerSpec
from cmdare.control.kinds import Destination
from cmdare.control.revocation import NoRevocations, RevocationSource

__all__ = ["Evacuate", "PsDecision", "PsServerInfo", "PsServerKernel", "RequestPsReplacement", "RestoreShards"]


@dataclass(frozen=True)
class PsServerInfo:
    """A transient PS server as the revocation sources see it (shaped like a worker's ``WorkerInfo``).

    ``worker_id`` is its revocation key: ``-1 - n`` for the run's ``n``-th PS server, never a worker's id;
    ``slot`` is -1, so no scripted worker slot names it.
    """

    worker_id: int
    server: ServerSpec
    ready_at: float
    slot: int = -1

    @property
    def trained_at(self) -> float:
        """PS servers are revocable as soon as they are up."""
        return self.ready_at


@dataclass(frozen=True)
class Evacuate:
    """Move every block off PS server ``key`` before ``deadline``, onto ``"survivors"`` or ``"replacement"``."""

    key: int
    deadline: float
    onto: Destination


@dataclass(frozen=True)
class RequestPsReplacement:
    """Start a PS server of ``spec`` for the one ``replaces`` (key) leaves."""

    replaces: int
    spec: ServerSpec


@dataclass(frozen=True)
class RestoreShards:
    """PS server ``key`` dies with its shard: roll every shard back to the latest checkpoint."""

    key: int
    reason: str  # "no_notice" | "deadline_passed"


PsDecision = Evacuate | RequestPsReplacement | RestoreShards


class PsServerKernel:
    """The run's transient PS servers, their lifetimes and notices, and the evacuation policy.

    Args:
        revocations: the run's revocation source (its lifetimes are drawn here for PS servers).
        notice_s: seconds from a notice to the revocation (0: revocations come without notice).
        replace: start a replacement PS after an evacuation onto survivors (the last shard's evacuation
            always needs one).
    """

    def __init__(self, revocations: RevocationSource | None = None, notice_s: float = 0.0, replace: bool = True):
        self.revocations = revocations or NoRevocations()
        self.notice_s, self.replace = max(0.0, notice_s), replace
        self.servers: dict[int, PsServerInfo] = {}
        self.deadlines: dict[int, float] = {}  # key -> when its lifetime ends (the revocation)
        self.noticed: dict[int, float] = {}  # key -> deadline, once the notice came
        self.issued = 0  # keys handed out so far: the n-th is -n

    def next_key(self) -> int:
        """A new server key (negative, never a worker id), for a server about to be started."""
        self.issued += 1
        return -self.issued

    def issue_from(self, issued: int) -> None:
        """Keys asked for from now on go on after the first ``issued`` ones (a resumed run's)."""
        self.issued = issued

    def adopt(self, key: int, spec: ServerSpec, ready_at: float, deadline: float | None) -> None:
        """Server ``key`` is one a resumed run goes on with: ready at ``ready_at``, revoked at ``deadline`` (as
        drawn by the saved run; None: never)."""
        self.servers[key] = PsServerInfo(key, spec, ready_at)
        self.deadlines.pop(key, None)
        if deadline is not None:
            self.deadlines[key] = deadline

    def add(self, spec: ServerSpec, now: float, key: int | None = None) -> PsServerInfo:
        """A PS server is up (``key``: given by :meth:`next_key` when it was started); its lifetime is drawn now
        (transient servers only)."""
        info = PsServerInfo(self.next_key() if key is None else key, spec, now)
        self.servers[info.worker_id] = info
        deadline = self.revocations.deadline(info)  # type: ignore[arg-type]  # duck-typed WorkerInfo
        if deadline is not None:
            self.deadlines[info.worker_id] = deadline
        return info

    def remove(self, key: int) -> None:
        """The server ended (evacuated, revoked or released)."""
        self.servers.pop(key, None)
        self.deadlines.pop(key, None)
        self.noticed.pop(key, None)

    def candidates(self) -> list[PsServerInfo]:
        """Transient PS servers a periodic or scripted source may pick (not already noticed)."""
        return [s for k, s in self.servers.items() if s.server.transient and k not in self.noticed]

    def notices_due(self, now: float) -> list[int]:
        """Servers whose lifetime ends within the notice lead: their notice is due now."""
        return [k for k, at in self.deadlines.items() if k not in self.noticed and at - self.notice_s <= now]

    def revoke(self, key: int, now: float, num_shards: int, deadline: float | None = None) -> list[PsDecision]:
        """Server ``key``'s notice (or, without notice, its death) comes now; ``deadline`` defaults to the
        lifetime's end, else ``now + notice_s``. Returns what to do; ``num_shards`` counts the shards now."""
        if key not in self.servers or key in self.noticed:
            return []
        if self.notice_s <= 0:
            return [RestoreShards(key, "no_notice")]
        deadline = deadline if deadline is not None else self.deadlines.get(key, now + self.notice_s)
        deadline = max(deadline, now)
        self.noticed[key] = deadline
        spec = self.servers[key].server
        if num_shards > 1:
            out: list[PsDecision] = [Evacuate(key, deadline, Destination.SURVIVORS)]
            return out + ([RequestPsReplacement(key, spec)] if self.replace else [])
        return [Evacuate(key, deadline, Destination.REPLACEMENT), RequestPsReplacement(key, spec)]

    def deadline_passed(self, now: float) -> list[RestoreShards]:
        """Noticed servers still holding blocks at their deadline die now (the driver kills them)."""
        return [RestoreShards(k, "deadline_passed") for k, at in self.noticed.items() if at <= now]

    def pick(self, due: Sequence[int]) -> list[int]:
        """The PS keys among a source's picks (negative keys), in order."""
        return [k for k in due if k < 0 and k in self.servers]
