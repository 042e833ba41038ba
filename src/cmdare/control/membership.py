"""Membership as a value: the live workers, the chief, the replacements on their way, the LR scale.

Drivers never edit it: the :class:`~cmdare.control.kernel.MembershipKernel` returns a new value on
every change, and records each change in its timeline as a :class:`MembershipEvent`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from cmdare.cloud.servers import ServerSpec

__all__ = ["EVENT_KINDS", "Membership", "MembershipEvent", "PendingReplacement", "WorkerInfo"]

#: What a membership timeline records, in the order a driver sees them for one change.
EVENT_KINDS = ("join", "loss", "chief_change", "lr_change", "replacement_requested", "replacement_retried",
               "no_workers_left")


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as the policies see it.

    Attributes:
        worker_id: unique in the run, increasing in start order.
        slot: its data slot (a replacement takes the slot of the worker it replaces).
        server: the server it runs on (GPU type, region, price, transient).
        ready_at: when its server was ready; lifetimes count from here, in every driver.
        trained_at: when it finished its first step (None until then); only such workers are revoked
            by injected revocations.
    """

    worker_id: int
    slot: int
    server: ServerSpec
    ready_at: float
    trained_at: float | None = None


@dataclass(frozen=True)
class PendingReplacement:
    """A replacement asked for and not yet joined."""

    slot: int
    server: ServerSpec
    requested_at: float
    replaces: int


@dataclass(frozen=True)
class MembershipEvent:
    """One entry of a membership timeline (``kind`` in :data:`EVENT_KINDS`)."""

    kind: str
    time: float
    worker_id: int | None = None
    slot: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple:
        """What two drivers must agree on: kind, worker, slot and the decision's value (not the time)."""
        value = {k: v for k, v in self.details.items() if k in ("to", "scale", "gpu")}
        return (self.kind, self.worker_id, self.slot, tuple(sorted(value.items())))


_WORKER_ID = attrgetter("worker_id")


@dataclass(frozen=True)
class Membership:
    """Who trains now."""

    planned: int
    workers: tuple[WorkerInfo, ...] = ()
    chief: int | None = None
    pending: tuple[PendingReplacement, ...] = ()
    lr_scale: float = 1.0

    @property
    def live(self) -> int:
        """Number of live workers."""
        return len(self.workers)

    def worker(self, worker_id: int) -> WorkerInfo | None:
        """The live worker ``worker_id``, or None."""
        i = self._index(worker_id)
        return None if i is None else self.workers[i]

    def _index(self, worker_id: int) -> int | None:
        ids = list(map(_WORKER_ID, self.workers))
        return ids.index(worker_id) if worker_id in ids else None

    def with_worker(self, worker: WorkerInfo) -> Membership:
        """Add (or update) a worker; a replacement for its slot is no longer pending."""
        rest, i = self.workers, self._index(worker.worker_id)
        if i is not None:  # an update: the worker moves to the end, as a join would put it
            rest = rest[:i] + rest[i + 1:]
        pending = tuple(p for p in self.pending if p.slot != worker.slot) if self.pending else ()
        return Membership(self.planned, (*rest, worker), self.chief, pending, self.lr_scale)

    def without_worker(self, worker_id: int) -> Membership:
        """Drop a worker (lost or gone)."""
        i = self._index(worker_id)
        if i is None:
            return self
        return Membership(self.planned, self.workers[:i] + self.workers[i + 1:], self.chief, self.pending,
                          self.lr_scale)

    def replace(self, **changes: Any) -> Membership:
        """A copy with ``changes`` (chief, pending, lr_scale)."""
        return dataclasses.replace(self, **changes)
