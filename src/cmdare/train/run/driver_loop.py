"""What every Ray driver of the run controller shares, whatever the topology: the loop, the workers' commands.

Each pass waits (at most :data:`LOOP_TICK_S`, or until the controller's next deadline) for whatever Ray
brings first: a worker's chunk, a chief duty, a worker coming up, or what the topology's driver waits on. Each
becomes an event (:mod:`cmdare.control.run_events`); the controller answers with commands
(:mod:`cmdare.control.run_commands`), which the executors carry out on Ray. Events a command raises wait until
the whole batch is carried out (the controller is never re-entered). Nothing is decided here.

A topology's driver (:class:`~cmdare.train.run.ray_driver.RayDriver` for a parameter server,
:class:`~cmdare.train.allreduce.allreduce_driver.AllReduceDriver` for an all-reduce group) adds how chunks are fed
and read back, the duties, the probe and its own commands.

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
from cmdare.events import StepReport
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.duties.chief_duties import ChiefDuties
from cmdare.train.run.run_metrics import RunMetrics
from cmdare.train.runtime import run_files
from cmdare.train.runtime.cluster_health import LoopWatchdog, cluster_lost, probe_actors
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.runtime.faults import user_mistake
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.worker_executor import WorkerExecutor

__all__ = ["LOOP_TICK_S", "PROBE_TIMEOUT_S", "UPLOAD_DRAIN_S", "DriverLoop"]

LOOP_TICK_S = 0.05  # the longest a pass waits for Ray before it tells the controller that time passed
UPLOAD_DRAIN_S = 120.0  # how long to wait for checkpoint uploads still in flight (a restore, the end)
PROBE_TIMEOUT_S = 10.0  # how long a probed worker or shard may take to answer

#: Commands that only feed the workers (train, stop at the fence, hold): not decisions worth a record each.
_FEEDING = (C.Train, C.Fence, C.HoldAll)


class DriverLoop:
    """The loop and the worker commands of a run's Ray driver (a topology's driver adds the rest).

    Args:
        controller: the run's decisions.
        spec, storage: the run's configuration and storage (its status file, the checkpoint a restore loads).
        workers, duties: the workers' and the chief duties' executors.
        emitter, metrics, detached: the run's reports, its speed window and calls left to finish.
        initial: the state the run started from (a fresh model's, or the checkpoint it resumed from).
        real: a real cluster (cloud time is the wall clock); else local emulation.
    """

    #: The topology class the controller must run (checked when the driver is built).
    topology_class: type = object

    def __init__(self, controller: RunController, spec: TrainSpec, storage: Storage, workers: WorkerExecutor,
                 duties: ChiefDuties, emitter: RunEmitter, metrics: RunMetrics, detached: DetachedCalls,
                 initial: Checkpoint, real: bool):
        if not isinstance(controller.topology, self.topology_class):
            raise TypeError(f"{type(self).__name__} drives a {self.topology_class.__name__}, not "
                            f"{type(controller.topology).__name__}")
        self.controller, self.spec, self.storage = controller, spec, storage
        self._handlers = handler_table(self, "_do_", C.Command)  # every kind of command, or it fails here
        self.workers, self.duties = workers, duties
        self.emitter, self.metrics, self.detached = emitter, metrics, detached
        self.initial, self.real = initial, real
        self.global_step = initial.step
        self.fence = initial.step
        self.feeding: set[int] = set()  # workers told to train, until they stop
        self.inflight: dict[Any, int] = {}  # chunk calls -> their worker
        self.queued: collections.Counter[int] = collections.Counter()  # chunks in flight per worker
        self.end: C.EndRun | None = None
        self._queue: list[E.Event] = []
        self._busy = False
        self._reported = 0  # state transitions of the controller reported so far
        self._next_heartbeat = 0.0
        self._round_feed: dict[int, bool] = {}  # lockstep: the chunk-end step -> whether that round goes on
        self._storage_failing = False  # the last heartbeat could not be written
        self.stop_why: str | None = None  # a stop was asked for (Ctrl-C, SIGTERM): told to the controller once
        self._stop_told = False

    # -- what a topology's driver adds -----------------------------------------------------------------
    def _num_ps(self) -> int:
        """The run's parameter shards (its status file says how many)."""
        return 0

    def _more_refs(self) -> list[Any]:
        """Calls of the topology's own the loop waits on besides chunks, duties and workers coming up."""
        return []

    def _arrived_more(self, ref: Any, wall: float) -> None:
        """One of :meth:`_more_refs` returned."""

    def _chunk_result(self, wid: int, w: Any, res: Any, wall: float) -> None:
        """Worker ``wid``'s chunk returned ``res`` (``w``: its handle, None when it is gone already)."""
        raise NotImplementedError

    def _actor_failed(self, wid: int, err: Exception, wall: float) -> list[E.Event]:
        """Worker ``wid``'s actor died in a chunk: what the controller hears."""
        return [E.ChunkFailed(wall=wall, worker_id=wid, error=type(err).__name__)]

    def _annotate(self, ev: E.Event) -> E.Event:
        """An event a command raised, as the controller is to hear it."""
        return ev

    def _periodic(self, wall: float) -> None:
        """Uploads finished, the status heartbeat, the workers' upkeep."""
        events = self._heartbeat(wall)
        events += self.workers.tick(wall)
        self._event(*map(self._stamp, events))

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, worker_specs: Sequence[Any], ps_spec: Any, watchdog: LoopWatchdog | None = None) -> C.EndRun:
        """Start the run and drive it to its end; returns how it ended. ``watchdog`` hears each pass."""
        wall = time.time()
        self._busy = True
        self._execute(self.controller.start(worker_specs, ps_spec, self._num_ps(), self.global_step,
                                            wall, now=wall if self.real else None))
        self._busy = False
        self._flush()
        run_files.write_status(self.storage, "running", self._num_ps(), self.global_step)
        self._started(time.time())
        while self.end is None:
            if watchdog is not None:
                watchdog.beat()
            self._pass()
        return self.end

    def _started(self, wall: float) -> None:
        """The run's first commands are carried out: the periodic work starts counting."""
        self._next_heartbeat = wall + run_files.HEARTBEAT_S

    def _pass(self) -> None:
        import ray

        refs = [*self.inflight, *self.duties.refs, *self.workers.ready_refs, *self._more_refs()]
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
            self._queue.extend(self._stamp(self._annotate(ev)) for ev in events)
        for _at, previous, state in self.controller.transitions[self._reported:]:
            self.emitter.event("run_state", details={"from": str(previous), "to": str(state)})
        self._reported = len(self.controller.transitions)

    def _arrived(self, ref: Any) -> None:
        wall = time.time()
        if ref in self.inflight:
            self._chunk_back(ref, wall)
        elif ref in self.duties.refs:
            self._event(*map(self._stamp, self.duties.finish(ref, wall)))
        elif ref in self.workers.ready_refs:
            self._event(*map(self._stamp, self.workers.up(ref, wall)))
        else:
            self._arrived_more(ref, wall)

    def _chunk_back(self, ref: Any, wall: float) -> None:
        import ray

        wid = self.inflight.pop(ref)
        self.queued[wid] -= 1
        w = self.workers.workers.get(wid)
        try:
            res = ray.get(ref)
        except ray.exceptions.RayError as err:
            if w is None:
                return  # a chunk of a worker already gone (revoked, left): its failure was expected
            self.feeding.discard(wid)
            if (said := user_mistake(err)) is not None:  # any worker would fail the same way: the run ends
                self._event(self._stamp(E.CodeFailed(wall=wall, worker_id=wid, error=said)))
                return
            if not isinstance(err, ray.exceptions.RayActorError):
                raise
            self._event(*map(self._stamp, self._actor_failed(wid, err, wall)))
            return
        self._chunk_result(wid, w, res, wall)

    def _record_chunk(self, w: Any, steps: int, duration_s: float, loss: float, compute_s: float = 0.0,
                      comm_s: float = 0.0, staleness: tuple[int, ...] = ()) -> None:
        """A chunk of worker ``w`` ended now: the speed window, a newcomer's first chunk (it joined), the step
        report."""
        now = time.time()
        self.metrics.start_chunk(now - duration_s, self.global_step)
        if w.server.joined_at is None:
            self.workers.joined(w, now - duration_s, self.global_step)
        if steps:
            speed = self.metrics.window_speed(including=(now, self.global_step))
            self.emitter.emit("on_step", StepReport(self.emitter.run_id, now, self.global_step, w.worker_id, steps,
                                                    duration_s, loss, speed, compute_s, comm_s, staleness))

    def _heartbeat(self, wall: float) -> list[E.Event]:
        """Checkpoints stored since the last pass; status.json rewritten (the real step, and a sign the run is
        alive) on its period and whenever a checkpoint was stored (the step trained never trails the stored)."""
        events: list[E.Event] = list(self.duties.collect(wall))
        stored = any(isinstance(e, E.CheckpointStored) for e in events)
        if wall >= self._next_heartbeat or stored:
            self._next_heartbeat = wall + run_files.HEARTBEAT_S
            failed = run_files.heartbeat(self.storage, self._num_ps(), self.global_step)
            if failed is not None and not self._storage_failing:  # said once, until a write succeeds again
                self.emitter.event("storage_warning", details={
                    "warning": f"the run's storage {self.storage.uri} cannot be written ({failed}): its status "
                               "(and any checkpoint) is not stored; training goes on", "storage": self.storage.uri})
            self._storage_failing = failed is not None
        return events

    def _lockstep_feeding(self, go: bool, step: int, done: bool) -> bool:
        """Lockstep members end chunks on one round: the first back from a round decides for every member of it,
        so none is left alone in a round (a hold that comes between their returns waits for the next round)."""
        decided = self._round_feed.setdefault(step, go)
        for old in [s for s in self._round_feed if s < step]:
            del self._round_feed[old]
        return decided and not done and step < self.fence

    # -- commands: training --------------------------------------------------------------------------------
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

    def _do_Note(self, cmd: C.Note) -> None:
        self.emitter.event(cmd.kind, details=cmd.details)

    def _do_Probe(self, cmd: C.Probe) -> list[E.Event]:
        """Nothing heard for a while: are the cluster, the topology's servers and the training workers still
        there?"""
        wall = time.time()
        lost = cluster_lost()
        if lost is not None:
            return [E.ClusterLost(wall=wall, message=lost)]
        servers = self._probe_servers(wall)
        if servers:
            return servers
        actors = {wid: self.workers.workers[wid].actor for wid in self.feeding if wid in self.workers.workers}
        failed, pending = probe_actors(actors, self._probe_timeout_s)
        self.detached.add(*pending)
        events: list[E.Event] = [
            E.ChunkFailed(wall=wall, worker_id=wid,
                          error=f"unresponsive for {cmd.silent_s:.0f} s" if why == "unresponsive" else why)
            for wid, why in failed.items()]
        return [*events, E.ProbeDone(wall=time.time(), ok=not events)]

    #: How long a probed worker may take to answer.
    _probe_timeout_s = PROBE_TIMEOUT_S

    def _probe_servers(self, wall: float) -> list[E.Event]:
        """The topology's own servers, probed before the workers (what the controller hears; empty: all fine)."""
        return []

    def _do_EndRun(self, cmd: C.EndRun) -> None:
        self.end = cmd

    def take_running(self) -> list[Any]:
        """The calls still in flight (forgotten here: the caller ends them)."""
        running = [*self.inflight, *self.duties.refs, *self.workers.ready_refs, *self._more_refs()]
        self.inflight, self.duties.refs, self.workers.ready_refs = {}, {}, {}
        return running
