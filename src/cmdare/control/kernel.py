"""The membership kernel: applies the policies to joins and losses and says what to do.

Drivers (the Ray trainer, the SimPy simulator) tell the kernel what happened (:meth:`join`,
:meth:`trained`, :meth:`lose`) and act on the decision values it returns; they ask :meth:`due` which
workers the revocation source revokes now. The kernel owns the :class:`Membership` value and the
timeline of every change, so two drivers fed the same events produce the same timeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.chief import CHIEF_POLICIES, ChiefPolicy
from cmdare.control.lr import LR_POLICIES, LrPolicy
from cmdare.control.membership import Membership, MembershipEvent, PendingReplacement, WorkerInfo
from cmdare.control.replacement import REPLACEMENT_POLICIES, Offer, Replace, ReplacementPolicy
from cmdare.control.revocation import NoRevocations, RevocationSource

__all__ = ["ChiefChange", "Decision", "LrChange", "MembershipKernel", "NoWorkersLeft", "RequestReplacement"]


@dataclass(frozen=True)
class ChiefChange:
    """The chief role moves (``chief`` None: no worker is left to hold it)."""

    previous: int | None
    chief: int | None


@dataclass(frozen=True)
class LrChange:
    """Multiply the configured learning rate by ``scale`` from now on."""

    previous: float
    scale: float
    active: int


@dataclass(frozen=True)
class RequestReplacement:
    """Start a server of ``spec``; its worker takes data slot ``slot``."""

    slot: int
    spec: ServerSpec
    replaces: int


@dataclass(frozen=True)
class NoWorkersLeft:
    """No worker is live and none is on its way: training cannot go on."""


Decision = ChiefChange | LrChange | RequestReplacement | NoWorkersLeft


class MembershipKernel:
    """Membership state plus the policies that change it.

    Args:
        planned: the number of workers the run was configured with.
        replacement, lr_policy, chief: policies or their registered names.
        revocations: the revocation source (default: none).
        offers: what a replacement could run on, given the lost server (for ``cheapest``).

    Every method takes ``now``, the driver's cloud time (emulated, simulated or the wall clock).
    """

    def __init__(self, planned: int, *, replacement: ReplacementPolicy | str = "same",
                 lr_policy: LrPolicy | str = "unchanged", chief: ChiefPolicy | str = "longest-serving",
                 revocations: RevocationSource | None = None,
                 offers: Callable[[ServerSpec], Sequence[Offer]] | None = None):
        self.replacement = REPLACEMENT_POLICIES.create(replacement) if isinstance(replacement, str) else replacement
        self.lr_policy = LR_POLICIES.create(lr_policy) if isinstance(lr_policy, str) else lr_policy
        self.chief_policy = CHIEF_POLICIES.create(chief) if isinstance(chief, str) else chief
        self.revocations = revocations or NoRevocations()
        self.offers = offers or (lambda _lost: ())
        self.state = Membership(planned)
        self.timeline: list[MembershipEvent] = []
        self.deadlines: dict[int, float] = {}
        self._revoking: set[int] = set()  # revoked by the driver, loss not yet detected
        self._tried: dict[int, list[ServerSpec]] = {}  # slot -> specs requested for it that did not come
        self.lr_damping = 1.0  # the product of the rollbacks' learning-rate scales

    # -- saved with a checkpoint -----------------------------------------------------------------
    def snapshot(self, leaving: Sequence[int] = ()) -> dict[str, Any]:
        """The membership and what was drawn for it, as JSON-able values; ``leaving``: noticed workers, left out
        (a resumed run does not bring them back)."""
        s = self.state
        return {"workers": [{"worker_id": w.worker_id, "slot": w.slot, "server": w.server.as_dict(),
                             "ready_at": w.ready_at, "trained_at": w.trained_at}
                            for w in s.workers if w.worker_id not in leaving],
                "chief": s.chief,
                "pending": [{"slot": p.slot, "server": p.server.as_dict(), "requested_at": p.requested_at,
                             "replaces": p.replaces} for p in s.pending],
                "deadlines": [[k, t] for k, t in self.deadlines.items() if k not in leaving],
                "tried": [[slot, [spec.as_dict() for spec in specs]] for slot, specs in self._tried.items()],
                "revocations": self.revocations.snapshot()}

    def resume(self, saved: dict[str, Any], now: float) -> list[Decision]:
        """Take the membership of a :meth:`snapshot` as it was (no election, no lifetime drawn); returns the
        decisions that tell a driver the chief and the learning rate."""
        workers = tuple(WorkerInfo(w["worker_id"], w["slot"], ServerSpec.from_dict(w["server"]), w["ready_at"],
                                   w["trained_at"]) for w in saved["workers"])
        pending = tuple(PendingReplacement(p["slot"], ServerSpec.from_dict(p["server"]), p["requested_at"],
                                           p["replaces"]) for p in saved["pending"])
        chief = saved["chief"] if any(w.worker_id == saved["chief"] for w in workers) else \
            self.chief_policy.elect(workers)
        self.state = Membership(self.state.planned, workers, None, pending, 1.0)
        self.deadlines = {int(k): float(t) for k, t in saved["deadlines"]}
        self._tried = {int(slot): [ServerSpec.from_dict(x) for x in specs] for slot, specs in saved["tried"]}
        self.revocations.restore(saved["revocations"])
        for w in workers:
            self._record("join", now, w.worker_id, w.slot, gpu=w.server.gpu_type, resumed=True)
        decisions: list[Decision] = [self._set_chief(chief, now)]
        return decisions + self._apply_lr(now)

    # -- what happened ---------------------------------------------------------------------------
    def start(self, workers: Sequence[WorkerInfo], now: float) -> list[Decision]:
        """The first wave of workers, all at once (one chief election, one learning-rate decision)."""
        ids = {w.worker_id for w in workers}
        if len(ids) == len(workers) and not ids & {w.worker_id for w in self.state.workers}:
            slots = {w.slot for w in workers}  # the membership is built once, not worker by worker
            self.state = self.state.replace(workers=(*self.state.workers, *workers),
                                            pending=tuple(p for p in self.state.pending if p.slot not in slots))
            for w in workers:
                self._admitted(w, now)
        else:
            for w in workers:
                self._add(w, now)
        decisions: list[Decision] = [self._set_chief(self.chief_policy.elect(self.state.workers), now)]
        return decisions + self._apply_lr(now)

    def join(self, worker: WorkerInfo, now: float) -> list[Decision]:
        """A worker's server is ready and its worker started (a replacement takes its slot)."""
        self._add(worker, now)
        decisions: list[Decision] = []
        if self.state.chief is None:
            decisions.append(self._set_chief(self.chief_policy.elect(self.state.workers), now))
        decisions += self._apply_lr(now)
        return decisions

    def trained(self, worker_id: int, now: float) -> None:
        """The worker finished its first step (from now on injected revocations may hit it)."""
        w = self.state.worker(worker_id)
        if w is not None and w.trained_at is None:
            self.state = self.state.with_worker(dataclasses.replace(w, trained_at=now))

    def mark_revoked(self, worker_id: int) -> None:
        """The driver revoked the worker's server; until its loss is reported, :meth:`due` skips it."""
        self._revoking.add(worker_id)
        self.deadlines.pop(worker_id, None)

    def lose(self, worker_id: int, now: float, replace: bool = True) -> list[Decision]:
        """A worker is gone (revoked, failed, or left after a notice); ``replace=False`` at the end."""
        lost = self.state.worker(worker_id)
        if lost is None:
            return []
        self.state = self.state.without_worker(worker_id)
        self.deadlines.pop(worker_id, None)
        self._revoking.discard(worker_id)
        self._record("loss", now, worker_id, lost.slot)
        decisions: list[Decision] = []
        if self.state.chief == worker_id:
            decisions.append(self._set_chief(self.chief_policy.elect(self.state.workers), now))
        decisions += self._apply_lr(now)
        if replace:
            choice = self.replacement.decide(lost.server, self.offers(lost.server))
            if isinstance(choice, Replace):
                pending = PendingReplacement(lost.slot, choice.spec, now, worker_id)
                self.state = self.state.replace(pending=(*self.state.pending, pending))
                self._record("replacement_requested", now, worker_id, lost.slot, gpu=choice.spec.gpu_type)
                decisions.append(RequestReplacement(lost.slot, choice.spec, worker_id))
        if not self.state.workers and not self.state.pending:
            self._record("no_workers_left", now)
            decisions.append(NoWorkersLeft())
        return decisions

    def replacement_failed(self, slot: int, now: float) -> list[Decision]:
        """The server requested for ``slot`` did not come (no node in time, or its worker failed to start):
        the replacement policy falls back to another spec or gives the slot up."""
        pending = next((p for p in self.state.pending if p.slot == slot), None)
        if pending is None:
            return []
        self.state = self.state.replace(pending=tuple(p for p in self.state.pending if p.slot != slot))
        tried = self._tried.setdefault(slot, [])
        tried.append(pending.server)
        self._record("replacement_failed", now, pending.replaces, slot, gpu=pending.server.gpu_type)
        choice = self.replacement.fallback(pending.server, tuple(tried), self.offers(pending.server))
        decisions: list[Decision] = []
        if isinstance(choice, Replace):
            again = PendingReplacement(slot, choice.spec, now, pending.replaces)
            self.state = self.state.replace(pending=(*self.state.pending, again))
            self._record("replacement_requested", now, pending.replaces, slot, gpu=choice.spec.gpu_type)
            decisions.append(RequestReplacement(slot, choice.spec, pending.replaces))
        elif not self.state.workers and not self.state.pending:
            self._record("no_workers_left", now)
            decisions.append(NoWorkersLeft())
        return decisions

    def retry(self, slot: int, now: float, why: str = "") -> list[Decision]:
        """The server requested for ``slot`` did not start for a reason that is not its worker's own (its node died
        or was drained, its scheduling was cancelled): the same server is asked for again; the slot stays pending,
        its request time unchanged. The driver decides whether to retry (its time-out, how often); the policy's
        fallback is for servers that do not come (:meth:`replacement_failed`)."""
        pending = next((p for p in self.state.pending if p.slot == slot), None)
        if pending is None:
            return []
        self._record("replacement_retried", now, pending.replaces, slot, details={"why": why},
                     gpu=pending.server.gpu_type)
        return [RequestReplacement(slot, pending.server, pending.replaces)]

    def due(self, now: float, started_at: float, *, workers: bool = True,
            others: Sequence[WorkerInfo] = ()) -> list[int]:
        """Workers the revocation source revokes at ``now``: expired lifetimes, then scheduled picks.

        ``others`` are more servers a periodic or scripted source picks among (transient PS servers, with
        negative ids, see :class:`~cmdare.control.ps_servers.PsServerInfo`); ``workers=False`` leaves the
        workers out (``hit=ps``)."""
        out: list[int] = []
        if workers and self.deadlines and min(self.deadlines.values()) <= now:
            expired = {wid for wid, t in self.deadlines.items() if t <= now}
            out = [w.worker_id for w in self._trained() if w.worker_id in expired]
        at = self.revocations.next_due(started_at)
        if at is not None and at <= now:  # a scheduled pick falls due
            for wid in self.revocations.due(now, started_at, [*(self._trained() if workers else ()), *others]):
                if wid not in out:
                    out.append(wid)
        return out

    def _trained(self) -> list[WorkerInfo]:
        """Live workers that trained and whose revocation is not under way (those a revocation may hit)."""
        return [w for w in self.state.workers if w.trained_at is not None and w.worker_id not in self._revoking]

    def _add(self, worker: WorkerInfo, now: float) -> None:
        self.state = self.state.with_worker(worker)
        self._admitted(worker, now)

    def _admitted(self, worker: WorkerInfo, now: float) -> None:
        """``worker`` is in the membership: record its join and draw its server's lifetime."""
        self._tried.pop(worker.slot, None)
        self._record("join", now, worker.worker_id, worker.slot, gpu=worker.server.gpu_type)
        deadline = self.revocations.deadline(worker)  # drawn once per server, when it is ready
        if deadline is not None:
            self.deadlines[worker.worker_id] = deadline

    # -- decisions -------------------------------------------------------------------------------
    def _set_chief(self, chief: int | None, now: float) -> ChiefChange:
        previous = self.state.chief
        self.state = self.state.replace(chief=chief)
        self._record("chief_change", now, chief, details={"from": previous, "to": chief})
        return ChiefChange(previous, chief)

    def damp_lr(self, factor: float, now: float) -> list[Decision]:
        """Training diverged and rolled back: from now on the learning rate is ``factor`` times what the policy
        says (the factors of several rollbacks multiply)."""
        self.lr_damping *= factor
        return self._apply_lr(now)

    def _apply_lr(self, now: float) -> list[Decision]:
        scale = self.lr_policy.scale(self.state.live, self.state.planned) * self.lr_damping
        previous = self.state.lr_scale
        if scale == previous:
            return []
        self.state = self.state.replace(lr_scale=scale)
        self._record("lr_change", now, details={"from": previous, "scale": scale, "active": self.state.live})
        return [LrChange(previous, scale, self.state.live)]

    def _record(self, kind: str, now: float, worker_id: int | None = None, slot: int | None = None,
                details: dict | None = None, **extra: object) -> None:
        self.timeline.append(MembershipEvent(kind, now, worker_id, slot, {**(details or {}), **extra}))
