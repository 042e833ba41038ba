"""The coordinator's loop: chunks of steps to the workers until the shards report the target step.

One :class:`ChunkLoop` per run. Each pass waits (at most :data:`LOOP_TICK_S`) for whatever comes
first: a worker's chunk, a chief duty, a replacement worker or PS that is up. Between passes it
injects revocations, admits replacements, collects checkpoints stored in the background and starts
the chief's next duty. An asynchronous worker has ``spec.chunks_ahead`` chunks queued, so it never
idles while the coordinator reads a result (a Ray round trip and the loop's bookkeeping, 6% of a
small model's steps with one chunk at a time). Work stops at a boundary (no push in flight, no duty
running) for what must see quiesced shards: placement changes, a PS evacuation, a restore of every
shard from the checkpoint after a shard died; then every worker gets its next chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cmdare.control import RevocationPlan
from cmdare.errors import ShardLostError, TransientError
from cmdare.events import StepReport
from cmdare.ps.psld.decisions import Decision
from cmdare.storage import Storage
from cmdare.train.chief_duties import ChiefDuties, DutySchedule
from cmdare.train.detached import DetachedCalls
from cmdare.train.emitter import RunEmitter
from cmdare.train.faults import classify
from cmdare.train.membership import MembershipExecutor, WorkerHandle
from cmdare.train.placement_changes import PlacementChanges
from cmdare.train.ps_evacuation import PsServerExecutor
from cmdare.train.run_control import write_status
from cmdare.train.run_metrics import RunMetrics
from cmdare.train.shard_group import ShardGroup
from cmdare.train.spec import TrainSpec
from cmdare.train.states import RunState
from cmdare.train.worker import ChunkResult

__all__ = ["LOOP_TICK_S", "SHARD_STATS_EVERY_S", "UPLOAD_DRAIN_S", "ChunkLoop"]

SHARD_STATS_EVERY_S = 2.0
LOOP_TICK_S = 0.05  # how often the loop looks at revocation deadlines and arriving replacements
UPLOAD_DRAIN_S = 120.0  # how long to wait for checkpoint uploads still in flight (a restore, the end)


class ChunkLoop:
    """Hands workers chunks of steps and holds them at boundaries; owns the run's global step.

    Args:
        spec: the run's configuration.
        run_id: named in the error when no worker is left.
        plan: the revocation plan (which servers injected revocations may hit).
        storage: the run's storage (its status file; the checkpoint a restore rolls back to).
        members, shards, duties, changes: the executors of membership, shards, chief duties and
            placement changes.
        ps_servers: the executor of transient PS servers (``--ps-transient``), else None.
        emitter, metrics, detached: the run's events, its speed window and calls left to finish.
        initial: the starting (parameters, momentum, step): what a restore without a checkpoint loads.
        settle: told the run's state (running, degraded or restoring) after each pass.
    """

    def __init__(self, spec: TrainSpec, run_id: str, plan: RevocationPlan, storage: Storage,
                 members: MembershipExecutor, shards: ShardGroup, duties: ChiefDuties, changes: PlacementChanges,
                 ps_servers: PsServerExecutor | None, emitter: RunEmitter, metrics: RunMetrics,
                 detached: DetachedCalls, initial: tuple[np.ndarray, np.ndarray, int],
                 settle: Callable[[RunState], None]):
        self.spec, self.run_id, self.plan, self.storage = spec, run_id, plan, storage
        self.members, self.shards, self.duties, self.changes = members, shards, duties, changes
        self.ps_servers, self.emitter, self.metrics, self.detached = ps_servers, emitter, metrics, detached
        self.initial, self.settle = initial, settle
        self.global_step = initial[2]
        self.schedule = DutySchedule(spec.checkpoint_every, spec.eval_every, spec.steps)
        self.planned: list[Decision] = []  # placement changes waiting for the workers to quiesce
        self.shard_failed = False  # a shard died: quiesce, then restore every shard from the checkpoint
        self.finished = False
        self._round_hold: tuple[int, bool] = (-1, False)  # sync: (chunk-end step, hold) decided by the first back
        self._inflight: dict[Any, WorkerHandle] = {}  # chunk calls, by reference
        self._duties: dict[Any, tuple[str, WorkerHandle]] = {}  # chief duties, by reference
        self._next_stats = 0.0
        self._ahead = 1 if spec.sync else spec.chunks_ahead  # chunks queued per worker
        self._next_balance = 0

    @property
    def workers(self) -> dict[int, WorkerHandle]:
        return self.members.workers

    def run(self) -> None:
        """Train until the target step, every chunk and duty in flight back (or given up)."""
        import ray

        self.schedule.restart(self.global_step)
        self._next_stats = time.time() + SHARD_STATS_EVERY_S
        self._next_balance = self.global_step + self.spec.balance_every
        self._submit_all()
        write_status(self.storage, "running", len(self.shards.shards), self.global_step)
        spot_ps = self.ps_servers
        ps_starting = spot_ps.starting if spot_ps is not None else {}
        parked = spot_ps.parked if spot_ps is not None else {}
        members = self.members
        while (self._inflight or self._duties or self.planned or self.shard_failed or parked
               or (not self.finished and (members.pending or members.starting))):
            ready, _ = ray.wait([*self._inflight, *self._duties, *members.starting, *ps_starting], num_returns=1,
                                timeout=LOOP_TICK_S)
            for ref in ready:
                self._arrived(ref, ps_starting)
            now = time.time()
            if self.finished:
                self._drop_revoked()
            else:
                self._between_chunks(now)
            self.detached.reap()
            self.duties.collect()  # checkpoints stored in the background meanwhile
            if now >= self._next_stats and not parked:  # a parked shard has no actor to ask
                self.collect_shard_stats()
                self._next_stats = now + SHARD_STATS_EVERY_S
            if not self.finished:
                self._at_boundary()

    def shard_lost(self) -> None:
        """A shard died: the workers quiesce, then every shard rolls back to the checkpoint."""
        self.shard_failed = True

    def collect_shard_stats(self) -> None:
        """Ask the shards for their load (a shard that does not answer is lost)."""
        if self.changes.collect_stats(self.global_step) is None:
            self.shard_failed = True

    def take_running(self) -> list[Any]:
        """The chunk and duty calls still in flight (forgotten here: the caller ends them)."""
        running = [*self._inflight, *self._duties]
        self._inflight, self._duties = {}, {}
        return running

    # -- one pass ----------------------------------------------------------------------------------
    def _arrived(self, ref: Any, ps_starting: dict[Any, Any]) -> None:
        """A call is back: a replacement PS or worker up, a chief duty, or a worker's chunk."""
        if ref in ps_starting:
            self.ps_servers.started(ref)
        elif ref in self.members.starting:  # a replacement's node came and its worker is up
            w = self.members.started(ref, time.time())
            if w is not None and not self.finished and not self._holding() and not self.shard_failed:
                self._feed(w)  # else: fed with the others after the change
        elif ref in self._duties:
            kind, w = self._duties.pop(ref)
            self.duties.finish(kind, w, ref)
        else:
            self._chunk_back(self._inflight.pop(ref), ref)

    def _chunk_back(self, w: WorkerHandle, ref: Any) -> None:
        import ray

        try:
            res: ChunkResult = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if isinstance(classify(err, w.worker_id), ShardLostError):
                self.shard_lost()
            elif self._member(w):  # else: a chunk queued behind the one that reported the loss
                self.members.lost(w, err)
            return
        if not self._member(w):  # queued behind the chunk that brought the notice: it stopped at once
            self.global_step = max(self.global_step, res.global_step)
            return
        self._record_chunk(w, res)
        self.finished = self.finished or res.done or self.global_step >= self.spec.steps
        if not self.finished and not self._holding():
            # Decide at a chunk boundary, before handing out more work: in synchronous mode every
            # worker returns from the same round, so none is left waiting at a shard's barrier.
            balance_due = self.global_step >= self._next_balance
            self.planned = self.changes.poll(self.global_step, balance_due)
            if balance_due:
                self._next_balance = self.global_step + self.spec.balance_every
        if res.notice is not None:
            self.members.leave(w, res.notice, lambda c: self.duties.run_now("checkpoint", c))
        elif not self.finished and not self._hold_at(res.global_step) and not self.shard_failed:
            if w is self.members.chief and not self._duties:
                self._start_due_duty(w)  # before its next chunk: the duty queues behind as few as can be
            self._feed(w)

    def _drop_revoked(self) -> None:
        """At the end a revoked worker's last chunk may take Ray's node-death timeout to fail: skip it."""
        self.planned = []
        for ref, w in [(r, w) for r, w in self._inflight.items() if w.revoked_at is not None]:
            del self._inflight[ref]
            self.detached.add(ref)  # fetched (its expected failure discarded) once Ray reports it
            if self._member(w):
                self.members.lost(w, None, replace=False)

    def _between_chunks(self, now: float) -> None:
        """Revocations due, replacements expired or arrived, and the run's state."""
        members, spot_ps = self.members, self.ps_servers
        picked = members.inject_revocations(now, workers=self.plan.hits("worker"),
                                            others=spot_ps.candidates() if spot_ps else ())
        if spot_ps is not None:
            spot_ps.tick(now, picked)
        members.expire(now)
        if not self._holding():
            for w in members.arrive(now):
                self._feed(w)
        if not self.workers and not members.pending and not members.starting:
            raise TransientError("every worker was lost and --replace none: no worker left to train "
                                 f"(resume from the checkpoint with --resume {self.run_id})")
        if self.shard_failed:
            self.settle(RunState.RESTORING)
        else:
            self.settle(RunState.DEGRADED if len(self.workers) < self.spec.workers else RunState.RUNNING)

    def _at_boundary(self) -> None:
        """Restore or change the shards once quiesced, else start the chief's due duty."""
        quiesced = not self._inflight and not self._duties  # no push in flight, no chief duty running
        if self.shard_failed:
            if quiesced:
                self._restore_shards()
                self.schedule.restart(self.global_step)
                self._submit_all()
        elif self._holding():
            if quiesced:
                # a worker revoked while the run held has no chunk in flight to fail: it is found lost
                # when its next chunk (below) fails, and it takes no layout change meanwhile
                actors = [w.actor for w in self.workers.values() if w.revoked_at is None]
                if self.planned:
                    self.changes.migrate(self.planned, actors, self.global_step)
                    self.planned = []
                if self.ps_servers is not None:
                    self.ps_servers.carry_out(actors, self.global_step)
                    if self.ps_servers.parked:  # parked: wait for the replacement
                        return
                self._submit_all()
        elif self.members.chief is not None and not self._duties:
            self._start_due_duty(self.members.chief)

    # -- holds, submissions, chunks --------------------------------------------------------------
    def _holding(self) -> bool:
        """Whether workers get no new work: placement changes or a PS evacuation wait for the boundary."""
        return bool(self.planned) or (self.ps_servers is not None and self.ps_servers.holding)

    def _hold_at(self, step: int) -> bool:
        """Whether a worker back from a chunk that ended at ``step`` waits. Synchronous workers end chunks on
        the same round: the first back decides for all, so none is left alone at a shard's barrier (a hold
        that begins between their returns, e.g. a PS notice, waits for the next round)."""
        if not self.spec.sync:
            return self._holding()
        if self._round_hold[0] != step:
            self._round_hold = (step, self._holding())
        return self._round_hold[1]

    def _start_due_duty(self, chief: WorkerHandle) -> None:
        """Start the checkpoint (else the evaluation) that is due on ``chief``, if any."""
        kind = self.schedule.take(self.global_step)
        if kind is not None:
            self._duties[self.duties.start(kind, chief)] = (kind, chief)

    def _member(self, w: WorkerHandle) -> bool:
        """Whether ``w`` is still one of the run's workers (not lost, not left)."""
        return self.workers.get(w.worker_id) is w

    def _submit_all(self) -> None:
        for w in self.workers.values():
            self._feed(w)

    def _feed(self, w: WorkerHandle) -> None:
        """Queue chunks on ``w`` until it has its share in flight."""
        queued = sum(1 for other in self._inflight.values() if other is w)
        for _ in range(self._ahead - queued):
            self._inflight[self._submit(w)] = w

    def _submit(self, w: WorkerHandle) -> Any:
        # Synchronous workers must end chunks on the same round, so chunks end by step count only.
        max_s = float("inf") if self.spec.sync else self.spec.chunk_s
        return w.actor.run_steps.remote(self.spec.chunk_steps, max_s, self.members.step_target_s(w))

    def _record_chunk(self, w: WorkerHandle, res: ChunkResult) -> None:
        now = time.time()
        self.metrics.start_chunk(now - res.duration_s, self.global_step)
        if w.server.joined_at is None:
            self.members.joined(w, now - res.duration_s, max(self.global_step, res.global_step))
        self.global_step = max(self.global_step, res.global_step)
        self.shards.add_waits(res.shard_wait_s)
        self.changes.observe_chunk(res.worker_id, res.steps, res.duration_s, res.compute_s)
        self.members.observe_step_time(w, res.steps, res.duration_s)
        if res.steps:
            speed = self.metrics.window_speed(including=(now, self.global_step))
            self.emitter.emit("on_step", StepReport(self.run_id, now, self.global_step, res.worker_id, res.steps,
                                                    res.duration_s, res.loss, speed, res.compute_s, res.comm_s,
                                                    res.staleness))

    def _restore_shards(self) -> None:
        """Replace dead shards and roll every shard back to the latest checkpoint."""
        self.duties.collect(wait=True, timeout_s=UPLOAD_DRAIN_S)  # roll back to the newest stored checkpoint
        step, details = self.shards.restore(self.storage, self.initial, self.global_step,
                                            [w.actor for w in self.workers.values() if w.revoked_at is None])
        self.global_step = step
        self.shard_failed = False
        self.emitter.event("shard_restored", details=details)
        if self.ps_servers is not None:
            self.ps_servers.sync()
