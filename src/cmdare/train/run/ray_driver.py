"""The Ray driver of a parameter-server run: Ray's results and errors in, the controller's commands carried out.

The loop and the workers' commands are every driver's (:class:`~cmdare.train.run.driver_loop.DriverLoop`); this
adds the parameter server's: shards that hand out the fence, the PS servers' executors
(:class:`~cmdare.train.ps.shard_group.ShardGroup`, :class:`~cmdare.train.ps.ps_evacuation.PsServerExecutor`),
placement changes (:class:`~cmdare.train.ps.placement_changes.PlacementChanges`; the PS commands' handlers are
:class:`~cmdare.train.run.ps_commands.PsCommands`), and the chief's duties on the shards' state. Nothing is decided
here.

A worker told to train gets chunks of steps, ``spec.chunks_ahead`` queued (asynchronous), until the global
step reaches the fence: the shards refuse pushes past it, so every worker stops exactly there and the
controller acts on quiesced shards.
"""

from __future__ import annotations

import time
from typing import Any

from cmdare.control import RunController
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.ps_topology import PsTopology
from cmdare.errors import ShardLostError
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.duties.chief_duties import ChiefDuties
from cmdare.train.ps.placement_changes import PlacementChanges
from cmdare.train.ps.ps_evacuation import PsServerExecutor
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.run.driver_loop import LOOP_TICK_S, PROBE_TIMEOUT_S, UPLOAD_DRAIN_S, DriverLoop
from cmdare.train.run.ps_commands import PsCommands
from cmdare.train.run.run_metrics import RunMetrics
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.runtime.faults import classify
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.chunk_result import ChunkResult
from cmdare.train.workers.worker_executor import WorkerExecutor

__all__ = ["LOOP_TICK_S", "PROBE_TIMEOUT_S", "SHARD_STATS_EVERY_S", "UPLOAD_DRAIN_S", "RayDriver"]

SHARD_STATS_EVERY_S = 2.0


class RayDriver(PsCommands, DriverLoop):
    """Carries out one parameter-server run's controller on Ray.

    Args:
        controller: the run's decisions.
        spec, storage: the run's configuration and storage (its status file, the checkpoint a restore loads).
        workers, shards, duties, changes, ps: the executors.
        emitter, metrics, detached: the run's reports, its speed window and calls left to finish.
        initial: the state the run started from (a fresh model's, or the checkpoint it resumed from): what a
            restore loads before the run stored a checkpoint of its own.
        real: a real cluster (cloud time is the wall clock); else local emulation.
    """

    topology_class = PsTopology

    def __init__(self, controller: RunController, spec: TrainSpec, storage: Storage, workers: WorkerExecutor,
                 shards: ShardGroup, duties: ChiefDuties, changes: PlacementChanges, ps: PsServerExecutor,
                 emitter: RunEmitter, metrics: RunMetrics, detached: DetachedCalls,
                 initial: Checkpoint, real: bool):
        self.shards, self.changes, self.ps = shards, changes, ps
        super().__init__(controller, spec, storage, workers, duties, emitter, metrics, detached, initial, real)
        self.topology: PsTopology = controller.topology
        self.drained: set[int] = set()  # PS servers whose notice came from Ray's drain
        self._ahead = 1 if spec.sync else spec.chunks_ahead
        self._next_stats = 0.0
        self._final_stats = False

    def _num_ps(self) -> int:
        return len(self.shards.shards)

    def _more_refs(self) -> list[Any]:
        return list(self.ps.ping_refs)

    def _arrived_more(self, ref: Any, wall: float) -> None:
        if ref in self.ps.ping_refs:
            self._event(*map(self._stamp, self.ps.spare_answered(ref, wall)))

    def _annotate(self, ev: E.Event) -> E.Event:
        return self.changes.with_moves(ev)

    def _started(self, wall: float) -> None:
        super()._started(wall)
        self._next_stats = wall + SHARD_STATS_EVERY_S

    def _actor_failed(self, wid: int, err: Exception, wall: float) -> list[E.Event]:
        if isinstance(classify(err, wid), ShardLostError):
            # every shard answering: the one it pushed to was replaced already (by a restore done or under way)
            dead = self.ps.dead_keys()
            lost = [E.ShardLost(wall=wall, keys=dead)] if dead else []
            return [E.ChunkFailed(wall=wall, worker_id=wid, shard_lost=True), *lost]
        return super()._actor_failed(wid, err, wall)

    def _chunk_result(self, wid: int, w: Any, res: ChunkResult, wall: float) -> None:
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
        return self._lockstep_feeding(go, res.global_step, res.done)

    def _record(self, w: Any, res: ChunkResult) -> None:
        self.shards.add_waits(res.shard_wait_s)
        self.workers.observe_step_time(w, res.steps, res.duration_s)
        self._record_chunk(w, res.steps, res.duration_s, res.loss, res.compute_s, res.comm_s, res.staleness)

    def _periodic(self, wall: float) -> None:
        """Uploads finished, shard load, ``cmdare ps`` requests and balancers that decide at any time, drains."""
        events = self._heartbeat(wall)
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
        raise TypeError("a parameter-server run forms no all-reduce group: Regroup is the AllReduceDriver's")

    # -- commands: the run -------------------------------------------------------------------------------------
    def _probe_servers(self, wall: float) -> list[E.Event]:
        """A dead or frozen shard first: it holds every worker that pushes to it."""
        dead = self.ps.dead_keys()
        return [E.ShardLost(wall=wall, keys=dead), E.ProbeDone(wall=time.time(), ok=False)] if dead else []

    def take_running(self) -> list[Any]:
        """The calls still in flight (forgotten here: the caller ends them)."""
        running = super().take_running()
        self.ps.ping_refs = {}
        return running

