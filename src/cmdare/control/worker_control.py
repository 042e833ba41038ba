"""The workers of a run as the controller sees them: started, joined, training, revoked, replaced.

The membership kernel (:class:`~cmdare.control.kernel.MembershipKernel`) holds the membership and applies the
policies (chief election, learning rate, replacement and fallback); this part keeps each worker's record
(its server's start-up, whether its process is up, whether it trains) and turns the kernel's decisions
into commands. Workers join a run when their server is *ready*: in emulation and in the simulator when
the emulated start-up ends (cloud time; the worker then trains once its real process is up, and its
lifetime counts from the ready time, never from the emulator's process start); on a real cluster when its
process is up.

The records are indexed (members, replacements on their way, workers training) and what is derived from
them is cached until they change, so a pass over a 64-worker cluster costs little: the simulator runs
thousands of runs through this code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.kernel import ChiefChange, Decision, LrChange, MembershipKernel, NoWorkersLeft, RequestReplacement
from cmdare.control.membership import WorkerInfo
from cmdare.control.run_commands import (
    CancelWorker,
    Command,
    Joined,
    LoseWorker,
    ReleaseWorker,
    Revoke,
    SetChief,
    SetLrScale,
    StartWorker,
)
from cmdare.control.run_config import RunConfig
from cmdare.control.spares import WarmSpares

__all__ = ["MAX_START_RETRIES", "WorkerControl", "WorkerRec"]

#: A replacement whose start fails for a reason not its own is asked for again at once, within the replacement
#: time-out (counted from its first request), at most this often in a row (so a failure that repeats at once,
#: or any in local emulation, where no time-out applies, cannot loop).
MAX_START_RETRIES = 10


@dataclass
class WorkerRec:
    """One worker: its slot and server, and where it is in its life."""

    worker_id: int
    slot: int
    spec: ServerSpec
    replaces: int | None
    requested_at: float  # cloud time (a retried start: its slot's first request, which the time-out counts from)
    requested_wall: float
    ready_at: float | None = None  # cloud time its server is ready (None: when its process is up)
    member: bool = False  # in the membership (joined)
    up: bool = False  # its process is up
    duties: int = 0  # chief duties it was given and has not finished
    leaving: bool = False  # noticed: leaves after its checkpoint
    gone: bool = False
    retries: int = 0  # starts of its slot's replacement asked for again before it (a failed start not its own)
    resumed: bool = False  # asked for by the run a resumed run goes on from (its ready time is that run's)
    heard: bool = False  # its start was answered (``ServerStarting``): its ready time is known

    @property
    def active(self) -> bool:
        return self.member and not self.gone


class WorkerControl:
    """Worker records plus the membership kernel; appends commands to ``out``."""

    def __init__(self, config: RunConfig, kernel: MembershipKernel, out: list[Command],
                 spares: WarmSpares | None = None):
        self.config, self.kernel, self.out = config, kernel, out
        self.spares = spares if spares is not None else WarmSpares(0, out)
        self.recs: dict[int, WorkerRec] = {}
        self.active: dict[int, WorkerRec] = {}  # members, not gone
        self.waiting: dict[int, WorkerRec] = {}  # replacements asked for, not joined, not given up
        self.training_ids: set[int] = set()  # told to train, not stopped since
        self.next_id = 0
        self.started_at: float | None = None  # cloud time of the first step: scheduled revocations count from it
        self.no_workers_left = False
        self.wall = 0.0  # the driver's clock at the event being handled (set by the controller)
        self.replace_lost = True  # False once the run is over: a worker lost then is not replaced
        self._cache: dict[str, float] = {}  # figures derived from the records, until they change
        self.lost_at: dict[int, float] = {}  # lost worker -> cloud time of its loss (its replacement's recovery)

    def _changed(self) -> None:
        self._cache.clear()

    # -- views ----------------------------------------------------------------------------------
    def members(self) -> list[WorkerRec]:
        return list(self.active.values())

    def trainable(self) -> list[WorkerRec]:
        """Members that could take work now (up, idle, no duty, not leaving)."""
        if len(self.training_ids) >= len(self.active):
            return []
        idle = self.active.keys() - self.training_ids
        return [r for wid, r in self.active.items() if wid in idle and r.up and not r.duties and not r.leaving]

    def training(self) -> bool:
        """Whether any worker is training."""
        return bool(self.training_ids)

    def is_training(self, worker_id: int) -> bool:
        return worker_id in self.training_ids

    def start_training(self, rec: WorkerRec) -> None:
        self.training_ids.add(rec.worker_id)

    def stopped(self, worker_id: int) -> None:
        self.training_ids.discard(worker_id)

    @property
    def chief(self) -> int | None:
        return self.kernel.state.chief

    def rec(self, worker_id: int) -> WorkerRec | None:
        return self.recs.get(worker_id)

    def rate(self, sync: bool) -> float:
        """Steps per cloud second of the emulated cluster: the members' speeds added up (asynchronous) or the
        slowest member's (synchronous rounds wait for it)."""
        key = "rate_sync" if sync else "rate"
        if key not in self._cache:
            speeds = [1.0 / self.config.seconds_per_step(r.spec.gpu_type) for r in self.active.values()
                      if not r.leaving]
            self._cache[key] = (min(speeds) if sync else sum(speeds)) if speeds else 0.0
        return self._cache[key]

    def counted(self) -> int:
        """Workers a synchronous round waits for: members whose process is up (or, in the first wave, will be)."""
        if "counted" not in self._cache:
            self._cache["counted"] = sum(1 for r in self.active.values()
                                         if not r.leaving and (r.up or r.replaces is None))
        return int(self._cache["counted"])

    def arriving(self) -> bool:
        """Emulation: whether a replacement joined (its emulated start-up ended) whose process is not up yet."""
        if "arriving" not in self._cache:
            self._cache["arriving"] = not self.config.admit_on_up and any(
                not r.up and not r.leaving and r.replaces is not None for r in self.active.values())
        return bool(self._cache["arriving"])

    # -- starting ---------------------------------------------------------------------------------
    def _new(self, slot: int, spec: ServerSpec, replaces: int | None, now: float, wall: float) -> WorkerRec:
        rec = WorkerRec(self.next_id, slot, spec, replaces, now, wall)
        self.next_id += 1
        self.recs[rec.worker_id] = self.waiting[rec.worker_id] = rec
        self._changed()
        spare = self.spares.take(spec) if replaces is not None else None
        why = (f"data slot {slot} of the first wave" if replaces is None else
               f"replaces worker {replaces} ({self.kernel.replacement.name} replacement: {spec.gpu_type} in "
               f"{spec.region})" + (f", on warm spare {spare.key}" if spare is not None else ""))
        self.out.append(StartWorker(rec.worker_id, slot, spec, replaces, spare.key if spare is not None else None,
                                    why=why))
        if spare is not None:
            self.spares.refill(spare, now, self.kernel.deadlines.values())
        return rec

    def start_wave(self, specs: Sequence[ServerSpec], now: float, wall: float, up: bool = False) -> None:
        """The first wave: a server per data slot, members from the start (their start-up is no part of the run);
        ``up``: their processes are up already."""
        recs = [self._new(slot, spec, None, now, wall) for slot, spec in enumerate(specs)]
        infos = []
        for rec in recs:
            rec.ready_at, rec.up = now, up
            self._join(rec)
            infos.append(WorkerInfo(rec.worker_id, rec.slot, rec.spec, now,
                                    now if self.config.trained_on_join else None))
        self.execute(self.kernel.start(infos, now), now, announce_chief=False)
        if self.config.trained_on_join:
            self.started_at = now

    # -- saved with a checkpoint -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The emulated fleet of workers as JSON-able values: the members (their servers, ready times and drawn
        lifetimes), the replacements on their way, the next worker id. A noticed worker is left out: it leaves."""
        leaving = [wid for wid, r in self.active.items() if r.leaving]
        waiting = [{"worker_id": r.worker_id, "slot": r.slot, "server": r.spec.as_dict(), "replaces": r.replaces,
                    "requested_at": r.requested_at, "ready_at": r.ready_at, "retries": r.retries,
                    "lost_at": self.lost_at.get(r.replaces) if r.replaces is not None else None}
                   for r in self.waiting.values() if not r.gone]
        return {"next_id": self.next_id, "started_at": self.started_at, "membership": self.kernel.snapshot(leaving),
                "waiting": waiting}

    def resume(self, saved: dict[str, Any], now: float, wall: float, up: bool = False) -> None:
        """A resumed run's workers are the saved run's (:meth:`snapshot`): the same ids, data slots, servers and
        lifetimes; each is started again (their start-up, like a first wave's, is no part of the run: emulated time
        did not pass while the run was stopped); replacements on their way are asked for again, ready when they were
        to be."""
        decisions = self.kernel.resume(saved["membership"], now)
        for info in self.kernel.state.workers:
            rec = WorkerRec(info.worker_id, info.slot, info.server, None, info.ready_at, wall, info.ready_at,
                            member=True, up=up)
            self.recs[rec.worker_id] = self.active[rec.worker_id] = rec
            self.out.append(StartWorker(rec.worker_id, rec.slot, rec.spec, None, None,
                                        why=f"data slot {rec.slot}: worker {rec.worker_id} of the resumed run"))
        for w in saved["waiting"]:
            rec = WorkerRec(w["worker_id"], w["slot"], ServerSpec.from_dict(w["server"]), w["replaces"],
                            w["requested_at"], wall, w["ready_at"], retries=w["retries"], resumed=True)
            self.recs[rec.worker_id] = self.waiting[rec.worker_id] = rec
            if w["lost_at"] is not None:
                self.lost_at[rec.replaces] = w["lost_at"]  # type: ignore[index]
            self.out.append(StartWorker(rec.worker_id, rec.slot, rec.spec, rec.replaces, None,
                                        why=f"replaces worker {rec.replaces}: asked for again by the resumed run"))
        self.next_id, self.started_at = saved["next_id"], saved["started_at"]
        self._changed()
        self.execute(decisions, now, announce_chief=False)

    def _join(self, rec: WorkerRec) -> None:
        rec.member = True
        self.waiting.pop(rec.worker_id, None)
        self.active[rec.worker_id] = rec
        self._changed()

    def server_starting(self, worker_id: int, startup_s: float | None, now: float) -> None:
        rec = self.waiting.get(worker_id)
        if rec is None:
            return
        rec.heard = True
        if not (rec.resumed and rec.ready_at is not None):  # a resumed one is ready as it was
            rec.ready_at = None if startup_s is None else now + max(0.0, startup_s)
            self._changed()

    def admit_ready(self, now: float) -> None:
        """Replacements whose emulated start-up has ended join now (cloud time)."""
        if self.config.admit_on_up or not self.waiting:
            return
        for rec in list(self.waiting.values()):
            if rec.ready_at is not None and rec.ready_at <= now:
                self._admit(rec, rec.ready_at, now)

    def process_up(self, worker_id: int, now: float) -> WorkerRec | None:
        """A worker's process is up; on a real cluster it joins now. Returns the record if it is live."""
        rec = self.recs.get(worker_id)
        if rec is None or rec.gone:
            return None
        rec.up = True
        self._changed()
        if not rec.member and self.config.admit_on_up:
            rec.ready_at = now
            self._admit(rec, now, now)
        return rec

    def _admit(self, rec: WorkerRec, ready_at: float, now: float) -> None:
        self._join(rec)
        if rec.replaces is not None:
            recovery = ready_at - self.lost_at.get(rec.replaces, ready_at)
            self.out.append(Joined(rec.worker_id, rec.replaces, recovery,
                                   why=f"its server is ready, {recovery:.3g} s after worker {rec.replaces} was lost"))
        trained = ready_at if self.config.trained_on_join else None
        self.execute(self.kernel.join(WorkerInfo(rec.worker_id, rec.slot, rec.spec, ready_at, trained), now), now)

    def trained(self, worker_id: int, now: float) -> None:
        """The worker's first chunk ended (real clusters: from now on injected revocations may hit it)."""
        if self.started_at is None:
            self.started_at = now
        self.kernel.trained(worker_id, now)
        self._changed()

    # -- losing -----------------------------------------------------------------------------------
    def lose(self, worker_id: int, now: float, reason: str, detected: bool = True, replace: bool = True) -> bool:
        """Worker ``worker_id`` is gone; the kernel re-elects the chief and may ask for a replacement. Returns
        False when it was gone already."""
        rec = self.recs.get(worker_id)
        if rec is None or rec.gone:
            return False
        rec.gone, rec.duties = True, 0
        self.training_ids.discard(worker_id)
        self.active.pop(worker_id, None)
        self.waiting.pop(worker_id, None)
        self._changed()
        if not rec.member:  # a replacement that never joined: its slot's request failed
            self.out.append(CancelWorker(worker_id, reason, why=f"a replacement that never joined: {reason}"))
            self.execute(self.kernel.replacement_failed(rec.slot, now), now)
            return True
        self.lost_at[worker_id] = now
        self.spares.worker_lost(now)
        decisions = self.kernel.lose(worker_id, now, replace and self.replace_lost)
        replaced = any(isinstance(d, RequestReplacement) for d in decisions)
        self.out.append(LoseWorker(worker_id, reason, replaced, detected,
                                   why=f"{reason}; {'replaced' if replaced else 'not replaced'} "
                                       f"({self.kernel.replacement.name} replacement)"))
        self.execute(decisions, now)
        self.spares.top_up(now, f"worker {worker_id} was lost: the pool is topped up", self.kernel.deadlines.values())
        return True

    def start_failed(self, worker_id: int, now: float, error: str) -> bool:
        """Worker ``worker_id``'s process did not start, for a reason not its own (its node died or was drained,
        its scheduling was cancelled). A replacement that never joined is asked for again at once (a new worker
        of the same slot and server, ``CancelWorker(retried=True)`` then ``StartWorker``) while its replacement
        time-out lasts, counted from its slot's first request, and at most :data:`MAX_START_RETRIES` times in a
        row; else, and for a worker of the first wave, the failure is a loss (:meth:`lose`: the replacement policy
        falls back). Returns False when it was gone already."""
        rec = self.recs.get(worker_id)
        if rec is None or rec.gone:
            return False
        timeout = self.config.replacement_timeout_s
        in_time = timeout is None or now - rec.requested_at < timeout
        if rec.member or rec.replaces is None or not in_time or rec.retries >= MAX_START_RETRIES:
            tried = f"; asked for {rec.retries + 1} times" if rec.retries else ""
            return self.lose(worker_id, now, f"failed to start ({error}){tried}")
        rec.gone = True
        self.waiting.pop(worker_id, None)
        self._changed()
        self.out.append(CancelWorker(worker_id, f"failed to start ({error})", retried=True,
                                     why="its start failed for a reason not its own: asked for again"))
        for d in self.kernel.retry(rec.slot, now, error):
            again = self._new(d.slot, d.spec, d.replaces, rec.requested_at, self.wall)  # the slot's time-out goes on
            again.retries = rec.retries + 1
        return True

    def revoke_due(self, now: float, others: Sequence[object] = (), due_by: float | None = None) -> list[int]:
        """Revoke the members whose lifetime ended or whom the revocation source picks by ``due_by`` (default
        ``now``, the time recorded); returns the PS keys the source picked among ``others``."""
        due_by = now if due_by is None else due_by
        if self.started_at is None or due_by < self._next_due():
            return []
        due = self.kernel.due(due_by, self.started_at, workers=self.config.hit_workers, others=others)
        self._changed()  # a scheduled source moved to its next pick
        for wid in due:
            if wid >= 0 and wid in self.active:
                self.out.append(Revoke(wid, why="its emulated lifetime ended, or the revocation schedule picked it"))
                self.lose(wid, now, "revoked", detected=False)
        return [k for k in due if k < 0]

    def _next_due(self) -> float:
        """The earliest cloud time the revocation source may revoke a member (cached until members change)."""
        if "due" not in self._cache:
            times = []
            if self.config.hit_workers and self.kernel.deadlines:  # members' deadlines (a lost one's is dropped)
                times = [min(self.kernel.deadlines.values())]
            if self.started_at is not None:
                at = self.kernel.revocations.next_due(self.started_at)
                if at is not None:
                    times.append(at)
            self._cache["due"] = min(times, default=math.inf)
        return self._cache["due"]

    def notice(self, worker_id: int, now: float) -> WorkerRec | None:
        """The worker's server got its notice: it stopped training and leaves (after a checkpoint if chief); a
        spare is asked for at once for its replacement."""
        rec = self.active.get(worker_id)
        if rec is None or rec.leaving:
            return None
        rec.leaving = True
        self.spares.noticed(now)
        self.training_ids.discard(worker_id)
        self.kernel.mark_revoked(worker_id)
        self._changed()
        return rec

    def release(self, worker_id: int, now: float) -> None:
        """A noticed worker leaves cleanly now."""
        rec = self.recs.get(worker_id)
        if rec is not None and not rec.gone:
            self.out.append(ReleaseWorker(worker_id, why="its server was noticed: it leaves at a step boundary"))
            self.lose(worker_id, now, "notice")

    def damp_lr(self, factor: float, now: float) -> None:
        """After a rollback: the learning rate is ``factor`` times lower from now on."""
        self.execute(self.kernel.damp_lr(factor, now), now)

    # -- time ---------------------------------------------------------------------------------------
    def unanswered(self) -> bool:
        """Whether a replacement was asked for and its start not answered yet (its ready time, unknown, may be
        now)."""
        return any(not r.heard for r in self.waiting.values())

    def next_time(self, now: float) -> float:
        """The next cloud time after ``now`` something is due for the workers (inf: nothing)."""
        times = [self._next_due()]
        if not self.config.admit_on_up:
            times += [r.ready_at for r in self.waiting.values() if r.ready_at is not None]
        timeout = self.config.replacement_timeout_s
        if timeout is not None:
            times += [r.requested_at + timeout for r in self.waiting.values()]
        return min((t for t in times if t > now), default=math.inf)

    def expire(self, now: float, wall: float) -> None:
        """Give up replacements that did not come in time: no node within the replacement time-out (cloud
        time), or a process that did not start within the start time-out (wall)."""
        timeout = self.config.replacement_timeout_s
        if timeout is not None:
            for rec in [r for r in self.waiting.values() if not r.up and now - r.requested_at >= timeout]:
                self.lose(rec.worker_id, now, f"no server within {timeout:g} s")
        if wall >= self.next_wall():
            for rec in [r for r in self.recs.values() if not r.gone and not r.up
                        and wall - r.requested_wall >= self.config.start_timeout_s]:
                self.lose(rec.worker_id, now, f"failed to start (not up within {self.config.start_timeout_s:g} s)")

    def next_wall(self) -> float:
        """The next wall time a start time-out falls due (inf: none)."""
        if math.isinf(self.config.start_timeout_s):
            return math.inf
        if "wall" not in self._cache:
            self._cache["wall"] = min((r.requested_wall + self.config.start_timeout_s for r in
                                       [*self.active.values(), *self.waiting.values()] if not r.up),
                                      default=math.inf)
        return self._cache["wall"]

    # -- the kernel's decisions ---------------------------------------------------------------------
    def execute(self, decisions: Sequence[Decision], now: float, announce_chief: bool = True) -> None:
        for d in decisions:
            if isinstance(d, ChiefChange):
                why = (f"chief {d.previous} gone: {self.kernel.chief_policy.name} election" if d.previous is not None
                       else "the first chief")
                self.out.append(SetChief(d.chief, d.previous, announce_chief, why=why))
            elif isinstance(d, LrChange):
                self.out.append(SetLrScale(d.scale, d.previous, d.active,
                                           why=f"{self.kernel.lr_policy.name} LR policy for {d.active} workers"))
            elif isinstance(d, RequestReplacement):
                self._new(d.slot, d.spec, d.replaces, now, self.wall)
            elif isinstance(d, NoWorkersLeft):
                self.no_workers_left = True
