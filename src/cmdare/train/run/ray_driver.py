"""The Ray driver of the run controller: Ray's results and errors in, the controller's commands carried out.

Each pass waits (at most :data:`LOOP_TICK_S`, or until the controller's next deadline) for whatever Ray
brings first: a worker's chunk, a chief duty, a worker or replacement PS coming up. Each becomes an event
(:mod:`cmdare.control.run_events`); the controller answers with commands (:mod:`cmdare.control.run_commands`),
which the executors carry out on Ray: workers (:class:`~cmdare.train.workers.worker_executor.WorkerExecutor`), the
shards and their servers (:class:`~cmdare.train.ps.shard_group.ShardGroup`,
:class:`~cmdare.train.ps.ps_evacuation.PsServerExecutor`), duties
(:class:`~cmdare.train.duties.chief_duties.ChiefDuties`) and placement changes
(:class:`~cmdare.train.ps.placement_changes.PlacementChanges`; the PS commands' handlers are
:class:`~cmdare.train.run.ps_commands.PsCommands`). Nothing is decided here.

A worker told to train gets chunks of steps, ``spec.chunks_ahead`` queued (asynchronous), until the global
step reaches the fence: the shards refuse pushes past it, so every worker stops exactly there and the
controller acts on quiesced shards. Events a command raises wait until the whole batch is carried out (the
controller is never re-entered).

Cloud time: on a real cluster it is the wall clock (events carry it); in local emulation the controller
derives it from the training progress the events report.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

from cmdare.control import RunController
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.dispatch import handler_table
from cmdare.control.ps_topology import PsTopology
from cmdare.errors import ShardLostError
from cmdare.events import StepReport
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.duties.chief_duties import ChiefDuties
from cmdare.train.ps.placement_changes import PlacementChanges
from cmdare.train.ps.ps_evacuation import PsServerExecutor
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.run.ps_commands import PsCommands
from cmdare.train.run.run_metrics import RunMetrics
from cmdare.train.runtime.cluster_health import LoopWatchdog, cluster_lost, probe_actors
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.runtime.faults import classify, user_mistake
from cmdare.train.runtime.run_files import HEARTBEAT_S, heartbeat, write_status
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.chunk_result import ChunkResult
from cmdare.train.workers.worker_executor import WorkerExecutor

__all__ = ["LOOP_TICK_S", "PROBE_TIMEOUT_S", "SHARD_STATS_EVERY_S", "UPLOAD_DRAIN_S", "RayDriver"]

SHARD_STATS_EVERY_S = 2.0
LOOP_TICK_S = 0.05  # the longest a pass waits for Ray before it tells the controller that time passed
UPLOAD_DRAIN_S = 120.0  # how long to wait for checkpoint uploads still in flight (a restore, the end)
PROBE_TIMEOUT_S = 10.0  # how long a probed worker or shard may take to answer


#: Commands that only feed the workers (train, stop at the fence, hold): not decisions worth a record each.
_FEEDING = (C.Train, C.Fence, C.HoldAll)


class RayDriver(PsCommands):
    """Carries out one run's controller on Ray.

    Args:
        controller: the run's decisions.
        spec, storage: the run's configuration and storage (its status file, the checkpoint a restore loads).
        workers, shards, duties, changes, ps: the executors.
        emitter, metrics, detached: the run's reports, its speed window and calls left to finish.
        initial: the state the run started from (a fresh model's, or the checkpoint it resumed from): what a
            restore loads before the run stored a checkpoint of its own.
        real: a real cluster (cloud time is the wall clock); else local emulation.
    """

    def __init__(self, controller: RunController, spec: TrainSpec, storage: Storage, workers: WorkerExecutor,
                 shards: ShardGroup, duties: ChiefDuties, changes: PlacementChanges, ps: PsServerExecutor,
                 emitter: RunEmitter, metrics: RunMetrics, detached: DetachedCalls,
                 initial: Checkpoint, real: bool):
        self.controller, self.spec, self.storage = controller, spec, storage
        if not isinstance(controller.topology, PsTopology):
            raise TypeError(f"the Ray driver trains through a parameter server, not {type(controller.topology)}")
        self.topology: PsTopology = controller.topology
        self._handlers = handler_table(self, "_do_", C.Command)  # every kind of command, or it fails here
        self.workers, self.shards, self.duties, self.changes, self.ps = workers, shards, duties, changes, ps
        self.emitter, self.metrics, self.detached = emitter, metrics, detached
        self.initial, self.real = initial, real
        self.global_step = initial.step
        self.fence = initial.step
        self.feeding: set[int] = set()  # workers told to train, until they stop
        self.inflight: dict[Any, int] = {}  # chunk calls -> their worker
        self.queued: collections.Counter[int] = collections.Counter()  # chunks in flight per worker
        self.end: C.EndRun | None = None
        self.drained: set[int] = set()  # PS servers whose notice came from Ray's drain
        self._ahead = 1 if spec.sync else spec.chunks_ahead
        self._queue: list[E.Event] = []
        self._busy = False
        self._reported = 0  # state transitions of the controller reported so far
        self._next_stats = self._next_heartbeat = 0.0
        self._final_stats = False
        self._round_feed: dict[int, bool] = {}  # synchronous: the chunk-end step -> whether that round goes on
        self._storage_failing = False  # the last heartbeat could not be written
        self.stop_why: str | None = None  # a stop was asked for (Ctrl-C, SIGTERM): told to the controller once
        self._stop_told = False

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, worker_specs: Sequence[Any], ps_spec: Any, watchdog: LoopWatchdog | None = None) -> C.EndRun:
        """Start the run and drive it to its end; returns how it ended. ``watchdog`` hears each pass."""
        wall = time.time()
        self._busy = True
        self._execute(self.controller.start(worker_specs, ps_spec, len(self.shards.shards), self.global_step,
                                            wall, now=wall if self.real else None))
        self._busy = False
        self._flush()
        write_status(self.storage, "running", len(self.shards.shards), self.global_step)
        self._next_stats = time.time() + SHARD_STATS_EVERY_S
        self._next_heartbeat = time.time() + HEARTBEAT_S
        while self.end is None:
            if watchdog is not None:
                watchdog.beat()
            self._pass()
        return self.end

    def _pass(self) -> None:
        import ray

        refs = [*self.inflight, *self.duties.refs, *self.workers.ready_refs, *self.ps.ping_refs]
        timeout = min(LOOP_TICK_S, max(0.0, self.controller.next_wakeup() - time.time()))
        ready: list[Any] = []
        if refs:
            ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
        else:
            time.sleep(timeout)
        for ref in ready:
            self._arrived(ref)
        wall = time.time()
        self.detached.reap()
        if self.stop_why is not None and not self._stop_told:
            self._stop_told = True
            self._event(self._stamp(E.StopRequested(wall=wall, why=self.stop_why)))
        self._periodic(wall)
        self._event(E.Tick(wall=wall, now=self._now(wall)))

    def _now(self, wall: float) -> float | None:
        return wall if self.real else None

    def _event(self, *events: E.Event) -> None:
        """Hand events to the controller and carry out its commands; events raised meanwhile wait their turn."""
        self._queue.extend(events)
        if not self._busy:
            self._flush()

    def _flush(self) -> None:
        self._busy = True
        try:
            while self._queue and self.end is None:
                self._execute(self.controller.handle(self._queue.pop(0)))
        finally:
            self._busy = False

    def _stamp(self, ev: E.Event) -> E.Event:
        return ev if ev.now is not None or not self.real else type(ev)(**{**ev.__dict__, "now": ev.wall})

    def _execute(self, commands: list[C.Command]) -> None:
        for cmd in commands:
            if not isinstance(cmd, _FEEDING):
                self.emitter.decision(cmd)
            events = self._handlers[type(cmd)](cmd) or []
            self._queue.extend(self._stamp(self.changes.with_moves(ev)) for ev in events)
        for _at, previous, state in self.controller.transitions[self._reported:]:
            self.emitter.event("run_state", details={"from": str(previous), "to": str(state)})
        self._reported = len(self.controller.transitions)

    # -- what Ray brings ----------------------------------------------------------------------------------
    def _arrived(self, ref: Any) -> None:
        wall = time.time()
        if ref in self.inflight:
            self._chunk_back(ref, wall)
        elif ref in self.duties.refs:
            self._event(*map(self._stamp, self.duties.finish(ref, wall)))
        elif ref in self.workers.ready_refs:
            self._event(*map(self._stamp, self.workers.up(ref, wall)))
        elif ref in self.ps.ping_refs:
            self._event(*map(self._stamp, self.ps.spare_answered(ref, wall)))

    def _chunk_back(self, ref: Any, wall: float) -> None:
        import ray

        wid = self.inflight.pop(ref)
        self.queued[wid] -= 1
        w = self.workers.workers.get(wid)
        try:
            res: ChunkResult = ray.get(ref)
        except ray.exceptions.RayError as err:
            if w is None:
                return  # a chunk of a worker already gone (revoked, left): its failure was expected
            self.feeding.discard(wid)
            if (said := user_mistake(err)) is not None:  # any worker would fail the same way: the run ends
                self._event(self._stamp(E.CodeFailed(wall=wall, worker_id=wid, error=said)))
                return
            if not isinstance(err, ray.exceptions.RayActorError):
                raise
            if isinstance(classify(err, wid), ShardLostError):
                # every shard answering: the one it pushed to was replaced already (by a restore done or under way)
                dead = self.ps.dead_keys()
                lost = [E.ShardLost(wall=wall, keys=dead)] if dead else []
                self._event(*map(self._stamp, [E.ChunkFailed(wall=wall, worker_id=wid, shard_lost=True), *lost]))
            else:
                self._event(self._stamp(E.ChunkFailed(wall=wall, worker_id=wid, error=type(err).__name__)))
            return
        self.global_step = max(self.global_step, res.global_step)
        if w is None:  # queued behind the chunk that brought a notice or a revocation: it stopped at once
            return
        self._record(w, res)
        diverged = res.diverged_at is not None
        events: list[E.Event] = [E.ChunkDone(wall=wall, worker_id=wid, global_step=res.global_step, steps=res.steps,
                                             refused=res.done, loss=res.loss if res.steps or diverged else None,
                                             params_finite=res.params_finite, diverged_at=res.diverged_at,
                                             duration_s=res.duration_s, compute_s=res.compute_s)]
        if res.overflow_skips:  # amp-fp16: gradients that overflowed were not pushed, the scale halved
            self.emitter.event("loss_scale_overflow", worker_id=wid,
                               details={"skipped": res.overflow_skips, "loss_scale": res.loss_scale})
        if res.at_risk is not None:
            self.emitter.event("rebalance_recommendation", worker_id=wid, details=dict(res.at_risk))
            events.append(E.WorkerAtRisk(wall=wall, worker_id=wid, provider=str(res.at_risk.get("provider"))))
        if res.notice is not None:
            self.feeding.discard(wid)
            if w.revoked_at is None:  # a chunk queued behind the one that brought the notice brings it again
                self.workers.notice(w, res.notice)
                events.append(E.WorkerNotice(wall=wall, worker_id=wid, provider=str(res.notice.get("provider")),
                                             deadline=res.notice.get("deadline") if self.real else None))
        elif self._keep_feeding(wid, res):  # a worker kept only to finish its round stays out of ``feeding``
            self._feed(wid)
        else:
            self.feeding.discard(wid)
        if wid not in self.feeding and not self.queued[wid] and res.notice is None:
            events.append(E.WorkerStopped(wall=wall, worker_id=wid, global_step=res.global_step))
        self._event(*map(self._stamp, events))

    def _keep_feeding(self, wid: int, res: ChunkResult) -> bool:
        """Whether a worker back from a chunk gets the next. Synchronous workers end chunks on one round: the
        first back from a round decides for every worker of it, so none is left alone at a shard's barrier (a
        hold that comes between their returns waits for the next round)."""
        go = wid in self.feeding and not res.done and res.global_step < self.fence
        if not self.spec.sync:
            return go
        decided = self._round_feed.setdefault(res.global_step, go)
        for old in [s for s in self._round_feed if s < res.global_step]:
            del self._round_feed[old]
        return decided and not res.done and res.global_step < self.fence

    def _record(self, w: Any, res: ChunkResult) -> None:
        now = time.time()
        self.metrics.start_chunk(now - res.duration_s, self.global_step)
        if w.server.joined_at is None:
            self.workers.joined(w, now - res.duration_s, self.global_step)
        self.shards.add_waits(res.shard_wait_s)
        self.workers.observe_step_time(w, res.steps, res.duration_s)
        if res.steps:
            speed = self.metrics.window_speed(including=(now, self.global_step))
            self.emitter.emit("on_step", StepReport(self.emitter.run_id, now, self.global_step, res.worker_id,
                                                    res.steps, res.duration_s, res.loss, speed, res.compute_s,
                                                    res.comm_s, res.staleness))

    def _periodic(self, wall: float) -> None:
        """Uploads finished, shard load, ``cmdare ps`` requests and balancers that decide at any time, drains."""
        events: list[E.Event] = list(self.duties.collect(wall))
        stored = any(isinstance(e, E.CheckpointStored) for e in events)  # the step trained never trails the stored
        if wall >= self._next_heartbeat or stored:  # status.json: the real step, and a sign the run is alive
            self._next_heartbeat = wall + HEARTBEAT_S
            failed = heartbeat(self.storage, len(self.shards.shards), self.global_step)
            if failed is not None and not self._storage_failing:  # said once, until a write succeeds again
                self.emitter.event("storage_warning", details={
                    "warning": f"the run's storage {self.storage.uri} cannot be written ({failed}): its status "
                               "(and any checkpoint) is not stored; training goes on", "storage": self.storage.uri})
            self._storage_failing = failed is not None
        if wall >= self._next_stats and not self.controller.holding and self.controller.action is None:
            self._next_stats = wall + SHARD_STATS_EVERY_S
            events += self.changes.loads(wall, self.global_step, self.ps.dead_keys)
        controller = self.controller
        if controller.action is None and not controller.holding and not self.topology.placement_waiting():
            requests = self.changes.requests()  # ``cmdare ps add|remove``: decided against the placement as it is
            if requests:
                events.append(E.PlacementRequested(wall=wall, requests=tuple(requests)))
        notices = self.ps.poll_drains(wall, self.topology.noticed)
        self.drained.update(n.key for n in notices)
        events += self.workers.tick(wall)
        self._event(*map(self._stamp, [*events, *notices]))

    # -- commands: training ---------------------------------------------------------------------------------
    def _feed(self, wid: int) -> None:
        """Queue chunks on worker ``wid`` until it has its share in flight."""
        w = self.workers.workers[wid]
        max_s = float("inf") if self.spec.sync else self.spec.chunk_s  # synchronous chunks end on one round
        for _ in range(self._ahead - self.queued[wid]):
            ref = w.actor.run_steps.remote(self.spec.chunk_steps, max_s, self.workers.step_target_s(w), self.fence)
            self.inflight[ref] = wid
            self.queued[wid] += 1

    def _do_Fence(self, cmd: C.Fence) -> None:
        self.fence = cmd.step
        self.shards.set_fence(cmd.step)

    def _do_Train(self, cmd: C.Train) -> None:
        w = self.workers.workers.get(cmd.worker_id)
        if w is None:
            return
        if w.spare is not None and w.server.joined_at is None and not self.queued[cmd.worker_id]:
            self.detached.add(w.actor.pull.remote())  # a warm spare pulled when it was taken: fresh parameters now
        self.feeding.add(cmd.worker_id)
        self._feed(cmd.worker_id)

    def _do_HoldAll(self, cmd: C.HoldAll) -> list[E.Event]:
        wall = time.time()
        idle = [wid for wid in self.feeding if not self.queued[wid]]
        self.feeding.clear()
        return [E.WorkerStopped(wall=wall, worker_id=wid, global_step=self.global_step) for wid in idle]

    # -- commands: workers ------------------------------------------------------------------------------------
    def _do_StartWorker(self, cmd: C.StartWorker) -> list[E.Event]:
        return self.workers.start(cmd, time.time())

    def _do_StartSpare(self, cmd: C.StartSpare) -> list[E.Event]:
        return self.workers.start_spare(cmd, time.time())

    def _do_CloseSpares(self, cmd: C.CloseSpares) -> None:
        if self.workers.pool is not None:
            self.workers.pool.close(cmd.failed_starts)

    def _do_Revoke(self, cmd: C.Revoke) -> None:
        self.workers.revoke(cmd)

    def _do_LoseWorker(self, cmd: C.LoseWorker) -> None:
        self.feeding.discard(cmd.worker_id)
        self.workers.lose(cmd)

    def _do_ReleaseWorker(self, cmd: C.ReleaseWorker) -> None:
        self.feeding.discard(cmd.worker_id)
        self.workers.leave(cmd)

    def _do_Joined(self, cmd: C.Joined) -> None:
        self.workers.joined_run(cmd)

    def _do_CancelWorker(self, cmd: C.CancelWorker) -> None:
        self.workers.cancel(cmd)

    def _do_SetChief(self, cmd: C.SetChief) -> None:
        self.workers.set_chief(cmd)

    def _do_SetLrScale(self, cmd: C.SetLrScale) -> None:
        self.workers.set_lr(cmd)

    def _do_SetRoundSize(self, cmd: C.SetRoundSize) -> None:
        self.shards.set_num_workers(cmd.n, wait=cmd.wait)

    def _do_StartDuty(self, cmd: C.StartDuty) -> list[E.Event]:
        loads: list[E.Event] = []
        if cmd.final and not self._final_stats:  # the last load window closes with the training
            self._final_stats = True
            loads = [e for e in self.changes.loads(time.time(), self.global_step, self.ps.dead_keys)
                     if isinstance(e, E.ShardLoads)]
        started = self.duties.start(cmd, self.workers.workers.get(cmd.worker_id), time.time())
        if any(isinstance(e, E.DutyDone) and e.shard_lost for e in started) and (dead := self.ps.dead_keys()):
            # which shards died, so that the controller asks for their replacements by key (lifetimes, notices)
            started = [E.ShardLost(wall=time.time(), keys=dead), *started]
        return [*loads, *started]

    def _do_Regroup(self, cmd: C.Regroup) -> None:
        raise TypeError("the Ray driver trains through a parameter server: an all-reduce group is not formed here")

    def _do_Note(self, cmd: C.Note) -> None:
        self.emitter.event(cmd.kind, details=cmd.details)

    # -- commands: the run -------------------------------------------------------------------------------------
    def _do_Probe(self, cmd: C.Probe) -> list[E.Event]:
        """Nothing heard for a while: are the training workers, the shards and the cluster still there?"""
        wall = time.time()
        lost = cluster_lost()
        if lost is not None:
            return [E.ClusterLost(wall=wall, message=lost)]
        dead = self.ps.dead_keys()  # first: a dead or frozen shard holds every worker that pushes to it
        if dead:
            return [E.ShardLost(wall=wall, keys=dead), E.ProbeDone(wall=time.time(), ok=False)]
        actors = {wid: self.workers.workers[wid].actor for wid in self.feeding if wid in self.workers.workers}
        failed, pending = probe_actors(actors, PROBE_TIMEOUT_S)
        self.detached.add(*pending)
        events: list[E.Event] = [
            E.ChunkFailed(wall=wall, worker_id=wid,
                          error=f"unresponsive for {cmd.silent_s:.0f} s" if why == "unresponsive" else why)
            for wid, why in failed.items()]
        return [*events, E.ProbeDone(wall=time.time(), ok=not events)]

    def _do_EndRun(self, cmd: C.EndRun) -> None:
        self.end = cmd

    def take_running(self) -> list[Any]:
        """The calls still in flight (forgotten here: the caller ends them)."""
        running = [*self.inflight, *self.duties.refs, *self.workers.ready_refs, *self.ps.ping_refs]
        self.inflight, self.duties.refs, self.workers.ready_refs, self.ps.ping_refs = {}, {}, {}, {}
        return running

