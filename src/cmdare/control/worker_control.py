"""The workers of a run as the controller sees them: started, joined, training, revoked, replaced.

The membership kernel (:class:`~cmdare.control.kernel.MembershipKernel`) holds the membership and applies the
policies (chief election, learning rate, replacement and fallback); this part keeps each worker's record
(its server's start-up, whether its process is up, whether it trains) and turns the kernel's decisions
into commands. Workers join a run when their server is *ready*: in emulation and in the simulator when
the emulated start-up ends (cloud time; the worker then trains once its real process is up, and its
lifetime counts from the ready time, never from the emulator's process start); on a real cluster when its
process is up.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cmdare.cloud.servers import ServerSpec
from cmdare.control.kernel import ChiefChange, Decision, LrChange, MembershipKernel, NoWorkersLeft, RequestReplacement
from cmdare.control.membership import WorkerInfo
from cmdare.control.run_commands import (
    CancelWorker,
    Command,
    LoseWorker,
    ReleaseWorker,
    Revoke,
    SetChief,
    SetLrScale,
    StartWorker,
)
from cmdare.control.run_config import RunConfig

__all__ = ["WorkerControl", "WorkerRec"]


@dataclass
class WorkerRec:
    """One worker: its slot and server, and where it is in its life."""

    worker_id: int
    slot: int
    spec: ServerSpec
    replaces: int | None
    requested_at: float  # cloud time
    requested_wall: float
    ready_at: float | None = None  # cloud time its server is ready (None: when its process is up)
    member: bool = False  # in the membership (joined)
    up: bool = False  # its process is up
    training: bool = False  # told to train and not stopped since
    duties: int = 0  # chief duties it was given and has not finished
    leaving: bool = False  # noticed: leaves after its checkpoint
    gone: bool = False

    @property
    def active(self) -> bool:
        return self.member and not self.gone


class WorkerControl:
    """Worker records plus the membership kernel; appends commands to ``out``."""

    def __init__(self, config: RunConfig, kernel: MembershipKernel, out: list[Command]):
        self.config, self.kernel, self.out = config, kernel, out
        self.recs: dict[int, WorkerRec] = {}
        self.next_id = 0
        self.started_at: float | None = None  # cloud time of the first step: scheduled revocations count from it
        self.no_workers_left = False
        self.wall = 0.0  # the driver's clock at the event being handled (set by the controller)
        self.replace_lost = True  # False once the run is over: a worker lost then is not replaced

    # -- views ----------------------------------------------------------------------------------
    def members(self) -> list[WorkerRec]:
        return [r for r in self.recs.values() if r.active]

    def trainable(self) -> Iterator[WorkerRec]:
        """Members that could take work now (up, idle, no duty, not leaving)."""
        return (r for r in self.members() if r.up and not r.training and not r.duties and not r.leaving)

    def training(self) -> list[WorkerRec]:
        return [r for r in self.recs.values() if r.training and not r.gone]

    def up_members(self) -> int:
        return sum(1 for r in self.members() if r.up and not r.leaving)

    @property
    def chief(self) -> int | None:
        return self.kernel.state.chief

    def rec(self, worker_id: int) -> WorkerRec | None:
        return self.recs.get(worker_id)

    def rate(self, sync: bool) -> float:
        """Steps per cloud second of the emulated cluster: the members' speeds added up (asynchronous) or the
        slowest member's (synchronous rounds wait for it)."""
        speeds = [1.0 / self.config.seconds_per_step(r.spec.gpu_type) for r in self.members() if not r.leaving]
        if not speeds:
            return 0.0
        return min(speeds) if sync else sum(speeds)

    # -- starting ---------------------------------------------------------------------------------
    def _new(self, slot: int, spec: ServerSpec, replaces: int | None, now: float, wall: float) -> WorkerRec:
        rec = WorkerRec(self.next_id, slot, spec, replaces, now, wall)
        self.next_id += 1
        self.recs[rec.worker_id] = rec
        self.out.append(StartWorker(rec.worker_id, slot, spec, replaces))
        return rec

    def start_wave(self, specs: Sequence[ServerSpec], now: float, wall: float) -> None:
        """The first wave: a server per data slot, members from the start (their start-up is no part of the run)."""
        recs = [self._new(slot, spec, None, now, wall) for slot, spec in enumerate(specs)]
        infos = []
        for rec in recs:
            rec.ready_at, rec.member = now, True
            infos.append(WorkerInfo(rec.worker_id, rec.slot, rec.spec, now,
                                    now if self.config.trained_on_join else None))
        self.execute(self.kernel.start(infos, now), now, announce_chief=False)
        if self.config.trained_on_join:
            self.started_at = now

    def server_starting(self, worker_id: int, startup_s: float | None, now: float) -> None:
        rec = self.recs.get(worker_id)
        if rec is not None and not rec.member:
            rec.ready_at = None if startup_s is None else now + max(0.0, startup_s)

    def admit_ready(self, now: float) -> list[WorkerRec]:
        """Replacements whose emulated start-up has ended join now (cloud time)."""
        out = []
        for rec in list(self.recs.values()):
            if (not rec.member and not rec.gone and not self.config.admit_on_up and rec.ready_at is not None
                    and rec.ready_at <= now):
                self._admit(rec, rec.ready_at, now)
                out.append(rec)
        return out

    def process_up(self, worker_id: int, now: float) -> WorkerRec | None:
        """A worker's process is up; on a real cluster it joins now. Returns the record if it is live."""
        rec = self.recs.get(worker_id)
        if rec is None or rec.gone:
            return None
        rec.up = True
        if not rec.member and self.config.admit_on_up:
            rec.ready_at = now
            self._admit(rec, now, now)
        return rec

    def _admit(self, rec: WorkerRec, ready_at: float, now: float) -> None:
        rec.member = True
        trained = ready_at if self.config.trained_on_join else None
        self.execute(self.kernel.join(WorkerInfo(rec.worker_id, rec.slot, rec.spec, ready_at, trained), now), now,
                     replaces=rec.replaces)

    def trained(self, worker_id: int, now: float) -> None:
        """The worker's first chunk ended (real clusters: from now on injected revocations may hit it)."""
        if self.started_at is None:
            self.started_at = now
        self.kernel.trained(worker_id, now)

    # -- losing -----------------------------------------------------------------------------------
    def lose(self, worker_id: int, now: float, reason: str, detected: bool = True, replace: bool = True) -> bool:
        """Worker ``worker_id`` is gone; the kernel re-elects the chief and may ask for a replacement. Returns
        False when it was gone already."""
        rec = self.recs.get(worker_id)
        if rec is None or rec.gone:
            return False
        rec.gone, rec.training, rec.duties = True, False, 0
        if not rec.member:  # a replacement that never joined: its slot's request failed
            self.out.append(CancelWorker(worker_id, reason))
            self.execute(self.kernel.replacement_failed(rec.slot, now), now)
            return True
        decisions = self.kernel.lose(worker_id, now, replace and self.replace_lost)
        replaced = any(isinstance(d, RequestReplacement) for d in decisions)
        self.out.append(LoseWorker(worker_id, reason, replaced, detected))
        self.execute(decisions, now, replaces=worker_id)
        return True

    def revoke_due(self, now: float, others: Sequence[object] = ()) -> list[int]:
        """Revoke the members whose lifetime ended or whom the revocation source picks now; returns the PS keys
        the source picked among ``others``."""
        if self.started_at is None:
            return []
        due = self.kernel.due(now, self.started_at, workers=self.config.hit_workers, others=others)
        for wid in due:
            rec = self.recs.get(wid)
            if wid >= 0 and rec is not None and rec.active:
                self.out.append(Revoke(wid))
                self.lose(wid, now, "revoked", detected=False)
        return [k for k in due if k < 0]

    def notice(self, worker_id: int) -> WorkerRec | None:
        """The worker's server got its notice: it stopped training and leaves (after a checkpoint if chief)."""
        rec = self.recs.get(worker_id)
        if rec is None or not rec.active or rec.leaving:
            return None
        rec.leaving, rec.training = True, False
        return rec

    def release(self, worker_id: int, now: float) -> None:
        """A noticed worker leaves cleanly now."""
        rec = self.recs.get(worker_id)
        if rec is not None and not rec.gone:
            self.out.append(ReleaseWorker(worker_id))
            self.lose(worker_id, now, "notice")

    def start_failed(self, worker_id: int, now: float, why: str) -> None:
        """A (non-deterministic) start failure: a member is lost and replaced; a replacement not joined yet
        falls back (the policy picks another server or gives the slot up)."""
        self.lose(worker_id, now, f"failed to start ({why})")

    # -- time ---------------------------------------------------------------------------------------
    def next_time(self) -> float:
        """The next cloud time something is due for the workers (inf: nothing)."""
        times = [r.ready_at for r in self.recs.values()
                 if not r.member and not r.gone and r.ready_at is not None and not self.config.admit_on_up]
        if self.started_at is not None:
            if self.config.hit_workers:
                members = {r.worker_id for r in self.members()}
                times += [t for wid, t in self.kernel.deadlines.items() if wid in members]
            at = self.kernel.revocations.next_due(self.started_at)
            if at is not None:
                times.append(at)
        timeout = self.config.replacement_timeout_s
        if timeout is not None:
            times += [r.requested_at + timeout for r in self.recs.values() if not r.member and not r.gone]
        return min(times, default=math.inf)

    def expire(self, now: float, wall: float) -> None:
        """Give up replacements that did not come in time: no node within the replacement time-out (cloud
        time), or a process that did not start within the start time-out (wall)."""
        timeout = self.config.replacement_timeout_s
        for rec in list(self.recs.values()):
            if rec.gone or rec.up:
                continue
            if not rec.member and timeout is not None and now - rec.requested_at >= timeout:
                self.lose(rec.worker_id, now, f"no server within {timeout:g} s")
            elif wall - rec.requested_wall >= self.config.start_timeout_s:
                self.start_failed(rec.worker_id, now, f"not up within {self.config.start_timeout_s:g} s")

    def next_wall(self) -> float:
        """The next wall time a start time-out falls due (inf: none)."""
        return min((r.requested_wall + self.config.start_timeout_s for r in self.recs.values()
                    if not r.gone and not r.up), default=math.inf)

    # -- the kernel's decisions ---------------------------------------------------------------------
    def execute(self, decisions: Sequence[Decision], now: float, replaces: int | None = None,
                announce_chief: bool = True) -> None:
        for d in decisions:
            if isinstance(d, ChiefChange):
                self.out.append(SetChief(d.chief, d.previous, announce_chief))
            elif isinstance(d, LrChange):
                self.out.append(SetLrScale(d.scale, d.previous, d.active))
            elif isinstance(d, RequestReplacement):
                self._new(d.slot, d.spec, d.replaces, now, self.wall)
            elif isinstance(d, NoWorkersLeft):
                self.no_workers_left = True
