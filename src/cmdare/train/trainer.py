"""The coordinator: the Ray executor of a training run.

It starts the shards (:class:`~cmdare.train.shard_group.ShardGroup`) and the workers
(:class:`~cmdare.train.membership.MembershipExecutor`, which carries out the control kernel's
membership decisions), hands workers chunks of steps until the shards report the target step, has
the chief checkpoint and evaluate (:class:`~cmdare.train.chief_duties.ChiefDuties`), and carries out
placement changes on quiesced shards. Its states are :class:`~cmdare.train.states.RunState`::

    starting -> running -> finishing -> finished          (any state -> failed on a final error)
                 |   ^
      revocation |   | replacement joined / chief re-elected / shards restored
                 v   |
          degraded / restoring

Checkpoints and evaluations are calls on the chief, awaited in the same loop, so a revocation is
noticed while they run. Ray's exceptions are sorted once (:func:`~cmdare.train.faults.classify`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cmdare import __version__
from cmdare.cloud.local import LocalProcessProvider, ServerProvider, StartupDelay
from cmdare.cloud.ray_cluster import RayClusterProvider
from cmdare.control import MembershipKernel, NoRevocations, RevocationPlan, WallClock, build_revocation_source
from cmdare.errors import ShardLostError, StorageError, TransientError, UserInputError
from cmdare.events import RunInfo, RunSummary, StepReport, TrainCallback
from cmdare.ps.blocks import ParamInfo
from cmdare.ps.psld.decisions import Decision
from cmdare.storage import Storage
from cmdare.train.balancing import DecisionSource
from cmdare.train.checkpoint import CheckpointStore
from cmdare.train.checkpoint_uploads import CheckpointUploads
from cmdare.train.chief_duties import ChiefDuties, DutySchedule
from cmdare.train.cluster import ensure_ray
from cmdare.train.detached import DetachedCalls
from cmdare.train.emitter import RunEmitter
from cmdare.train.faults import classify
from cmdare.train.gpu_speeds import emulated_step_stretch
from cmdare.train.membership import MembershipExecutor, WorkerHandle, catalog_offers
from cmdare.train.mitigation import default_decisions
from cmdare.train.placement_changes import PlacementChanges
from cmdare.train.ps_evacuation import PsServerExecutor, spot_ps_executor
from cmdare.train.run_control import new_run_id, write_run_spec, write_status
from cmdare.train.run_metrics import RunMetrics
from cmdare.train.setup import (
    gpus_per_worker,
    initial_state,
    joined_storage_warning,
    server_specs,
    training_storage,
)
from cmdare.train.shard_group import ShardGroup
from cmdare.train.spec import TrainSpec
from cmdare.train.states import RunState, RunStateMachine
from cmdare.train.teardown import release_run
from cmdare.train.worker import ChunkResult

SHARD_STATS_EVERY_S = 2.0
LOOP_TICK_S = 0.05  # how often the loop looks at revocation deadlines and arriving replacements
UPLOAD_DRAIN_S = 120.0  # at the end: how long to wait for checkpoint uploads still in flight


class Trainer:
    """Runs one :class:`TrainSpec` on Ray and reports through callbacks.

    Args:
        spec: the run's configuration.
        callbacks: measurement hooks (store recorder, TensorBoard, progress bar).
        address: join this Ray cluster (``"auto"`` on a cluster node) instead of starting one.
        run_id: the run's id (default: a new one).
        resume: continue run ``run_id`` from its latest checkpoint (or from ``resume_from``).
        checkpoint_dir: the run's own storage location (a directory, URL or :class:`~cmdare.storage.Storage`;
            default: ``RUN`` under ``spec.storage``, ``CMDARE_STORAGE`` or the data directory's ``checkpoints``).
        background_uploads: store checkpoints on a background thread (False: the loop waits for each).
        provider: where servers come from (default: one local Ray node, or the joined cluster).
        decisions: who changes the placement while training (default: the PSLD balancer when
            ``spec.placement == "psld"``; ``cmdare ps add|remove`` requests are always honoured).
    """

    def __init__(self, spec: TrainSpec, callbacks: Sequence[TrainCallback] = (), *,
                 address: str | None = None, run_id: str | None = None, resume: bool = False,
                 resume_from: str | Path | None = None, checkpoint_dir: str | Path | Storage | None = None,
                 provider: ServerProvider | None = None, decisions: DecisionSource | None = None,
                 background_uploads: bool = True):
        if resume and run_id is None and resume_from is None:
            raise UserInputError("resume needs the run id or a checkpoint path")
        self.spec = spec
        self.address = address
        self.resuming = resume or resume_from is not None
        self.run_id = run_id or new_run_id()
        self.storage = training_storage(spec, self.run_id, checkpoint_dir)
        self.storage_warning = joined_storage_warning(address, spec, checkpoint_dir)
        self.background_uploads = background_uploads
        self.resume_from = Path(resume_from) if resume_from else None
        self.plan = RevocationPlan.parse(spec.revocations, seed=spec.seed)
        priced = spec.model if spec.replace in ("cheapest", "cost-efficient") else None  # speeds cost a model fit
        self.kernel = MembershipKernel(spec.workers, replacement=spec.replace, lr_policy=spec.lr_policy,
                                       offers=lambda lost: catalog_offers(lost, priced),
                                       clock=WallClock())  # unknown names fail here
        self.worker_specs, self.ps_spec = server_specs(spec)
        from cmdare.predict import startup_model  # loaded when a phase is first sampled

        startup = StartupDelay(spec.startup, self.plan.speedup, spec.seed, model=startup_model)
        if provider is None:
            provider = RayClusterProvider(startup) if address else LocalProcessProvider(startup)
        self.provider = provider
        self.decisions = decisions
        self.metrics = RunMetrics()
        self.emitter = RunEmitter(self.run_id, [self.metrics, *callbacks], lambda: self.global_step)
        self.detached = DetachedCalls()
        self.state = RunStateMachine()
        self.global_step = 0
        self.infos: list[ParamInfo] = []
        self._planned: list[Decision] = []  # placement changes waiting for the workers to quiesce
        self._shard_failed = False  # a shard died: quiesce, then restore every shard from the checkpoint
        self._round_hold: tuple[int, bool] = (-1, False)  # sync: (chunk-end step, hold) decided by the first back
        self._initial: tuple[np.ndarray, np.ndarray, int] | None = None
        self._inflight: dict[Any, WorkerHandle] = {}  # the loop's chunk calls, by reference
        self._duties: dict[Any, tuple[str, WorkerHandle]] = {}  # the loop's chief duties, by reference
        self.schedule = DutySchedule(spec.checkpoint_every, spec.eval_every, spec.steps)
        self._started_ray = False
        self.emulated = self.provider.kind != "ray"
        self.shard_group: ShardGroup | None = None  # set up once Ray is
        self.members: MembershipExecutor | None = None
        self.duties: ChiefDuties | None = None
        self.placement_changes: PlacementChanges | None = None
        self.ps_servers: PsServerExecutor | None = None  # with --ps-transient

    @property
    def workers(self) -> dict[int, WorkerHandle]:
        """The live workers by id."""
        return self.members.workers if self.members is not None else {}

    @property
    def chief(self) -> WorkerHandle | None:
        """The chief worker (checkpoints and evaluates), if any."""
        return self.members.chief if self.members is not None else None

    @property
    def revocations(self) -> int:
        """Servers revoked so far (injected, noticed or failed)."""
        return self.metrics.revocations

    @property
    def shards(self) -> list[Any]:
        """The shard actors, in shard order."""
        return self.shard_group.shards if self.shard_group is not None else []

    # -- set-up --------------------------------------------------------------------------------
    def _prepare(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], int]:
        """The starting parameters (fresh or resumed); the revocation source (fails fast on a bad model)."""
        self.storage.check_writable()  # a bad --storage fails here, before Ray starts
        self.infos, params, momentum, buffers, step = initial_state(
            self.spec, self.run_id, self.storage, self.resume_from, self.resuming)
        write_run_spec(self.storage, self.run_id, self.spec.to_dict())
        source = build_revocation_source(self.plan)  # the same seeded draws as before the kernel
        self.kernel.revocations = source if self.spec.transient or self.spec.ps_transient else NoRevocations()
        return params, momentum, buffers, step

    def _setup(self, params: np.ndarray, momentum: np.ndarray, step: int) -> None:
        spec = self.spec
        self.shard_group = ShardGroup(spec, self.provider, self.ps_spec, self.infos, self.emitter, self.detached)
        self.members = MembershipExecutor(spec, self.kernel, self.provider, self.shard_group, self.emitter,
                                          self.detached, self.metrics.window_speed, lambda: self.global_step)
        self.members.num_gpus = gpus_per_worker(spec, joined=not self.provider.emulated)
        if self.provider.emulated and spec.worker_gpus:  # one machine stands in for several GPU types
            self.members.stretch = emulated_step_stretch(spec, self.emitter)
        meta = {"run_id": self.run_id, "spec": spec.to_dict()}
        uploads = CheckpointUploads(CheckpointStore(self.storage, spec.keep_checkpoints), self.background_uploads)
        self.duties = ChiefDuties(uploads, meta, self.infos, self.emitter,
                                  on_lost=lambda w, err: self.members.lost(w, err), on_shard_lost=self._shard_lost)
        self._initial = (params, momentum, step)
        self.shard_group.start(params, momentum, step)
        if self.decisions is None:
            self.decisions = default_decisions(spec, self.shard_group.placement, self.emitter)
        self.placement_changes = PlacementChanges(self.shard_group, self.decisions, self.emitter, self.storage)
        if spec.ps_transient:
            self.ps_servers = spot_ps_executor(spec, self.plan, self.kernel.revocations, self.shard_group,
                                               self.placement_changes, self.provider, self.emitter, self.decisions)
            self.ps_servers.on_killed = self._shard_lost  # restored even when no push is in flight to fail
        self.global_step = step

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Train to ``spec.steps``; always reports ``on_run_end``, also on failure."""
        import ray

        spec = self.spec
        params, momentum, buffers, step = self._prepare()
        need_cpus = (spec.workers + spec.warm_spares) * spec.cpus_per_worker + spec.ps * spec.cpus_per_shard
        self._started_ray = ensure_ray(self.address, num_cpus=max(os.cpu_count() or 1, int(np.ceil(need_cpus)) + 2))
        t_start = time.time()
        config = dict(spec.to_dict(), checkpoint_dir=self.storage.uri, provider=self.provider.kind)
        # emulated: a local stand-in for cloud servers, or real servers revoked by injection (asked for)
        self.emulated = self.provider.kind != "ray" or not isinstance(self.kernel.revocations, NoRevocations)
        self.emitter.emit("on_run_start", RunInfo(self.run_id, config, t_start, code_version=__version__,
                                                  emulated=self.emulated, resumed_from_step=step))
        if self.storage_warning:
            self.emitter.event("storage_warning", details={"warning": self.storage_warning,
                                                           "storage": self.storage.uri})
        status = RunState.FAILED
        try:
            self._setup(params, momentum, step)
            self.members.start(self.worker_specs, step)
            if buffers:
                ray.get([w.actor.load_buffers.remote(buffers) for w in self.workers.values()])
            if self.resuming:
                self.emitter.event("resume", details={"step": step})
            self._to(RunState.RUNNING)
            self._loop()
            self.members.cancel_starting()  # replacements still waiting for a node are not needed now
            self._to(RunState.FINISHING)
            self._final_duties()
            status = RunState.FINISHED
        except KeyboardInterrupt:
            status = RunState.INTERRUPTED
            raise
        finally:
            self._to(status)
            if self.duties is not None:  # nothing lost on failure: the uploads in flight finish first
                self.duties.collect(wait=True, timeout_s=UPLOAD_DRAIN_S)
                self.duties.uploads.close()
            for group in (self.members, self.shard_group):  # servers end before the run's end is reported,
                if group is not None:  # so the store records them (it is flushed at on_run_end)
                    group.release()
            summary = self._summary(str(status), t_start)
            with contextlib.suppress(OSError, StorageError):
                write_status(self.storage, str(status), self._num_shards(), self.global_step)
            self.emitter.emit("on_run_end", summary)
            self._shutdown()
        return summary

    def _to(self, state: RunState) -> None:
        previous = self.state.state
        if self.state.to(state):
            self.emitter.event("run_state", details={"from": str(previous), "to": str(state)})

    def _settle_state(self) -> None:
        """Running, degraded (fewer workers than planned) or restoring (a shard died)."""
        if self._shard_failed:
            self._to(RunState.RESTORING)
        else:
            self._to(RunState.DEGRADED if len(self.workers) < self.spec.workers else RunState.RUNNING)

    def _loop(self) -> None:
        import ray

        spec = self.spec
        self.schedule.restart(self.global_step)
        next_stats = time.time() + SHARD_STATS_EVERY_S
        next_balance = self.global_step + spec.balance_every
        inflight, duties = self._inflight, self._duties  # kept on the trainer: _shutdown fetches what is left
        for w in self.workers.values():
            inflight[self._submit(w)] = w
        finished = False
        write_status(self.storage, "running", self._num_shards(), self.global_step)
        members = self.members
        spot_ps = self.ps_servers
        ps_starting = spot_ps.starting if spot_ps is not None else {}
        parked = spot_ps.parked if spot_ps is not None else {}
        while (inflight or duties or self._planned or self._shard_failed or parked
               or (not finished and (members.pending or members.starting))):
            ready, _ = ray.wait([*inflight, *duties, *members.starting, *ps_starting], num_returns=1,
                                timeout=LOOP_TICK_S)
            for ref in ready:
                if ref in ps_starting:  # a replacement PS is up
                    spot_ps.started(ref)
                    continue
                if ref in members.starting:  # a replacement's node came and its worker is up
                    w = members.started(ref, time.time())
                    if w is not None and not finished and not self._holding() and not self._shard_failed:
                        inflight[self._submit(w)] = w  # else: submitted with the others after the change
                    continue
                if ref in duties:
                    kind, w = duties.pop(ref)
                    self.duties.finish(kind, w, ref)
                    continue
                w = inflight.pop(ref)
                try:
                    res: ChunkResult = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    if isinstance(classify(err, w.worker_id), ShardLostError):
                        self._shard_lost()
                    else:
                        self.members.lost(w, err)
                    continue
                self._record_chunk(w, res)
                finished = finished or res.done or self.global_step >= spec.steps
                if not finished and not self._holding():
                    # Decide at a chunk boundary, before handing out more work: in synchronous mode every
                    # worker returns from the same round, so none is left waiting at a shard's barrier.
                    self._planned = self.placement_changes.poll(self.global_step, self.global_step >= next_balance)
                    if self.global_step >= next_balance:
                        next_balance = self.global_step + spec.balance_every
                if res.notice is not None:
                    self.members.leave(w, res.notice, lambda c: self.duties.run_now("checkpoint", c))
                elif not finished and not self._hold_at(res.global_step) and not self._shard_failed:
                    if w is self.members.chief and not duties:
                        self._start_due_duty(w)  # before its next chunk: the duty does not queue behind it
                    inflight[self._submit(w)] = w
            now = time.time()
            if finished:  # a revoked worker's last chunk may take Ray's node-death timeout to fail: skip it
                self._planned = []
                for ref, w in [(r, w) for r, w in inflight.items() if w.revoked_at is not None]:
                    del inflight[ref]
                    self.detached.add(ref)  # fetched (its expected failure discarded) once Ray reports it
                    self.members.lost(w, None, replace=False)
            else:
                picked = members.inject_revocations(now, workers=self.plan.hits("worker"),
                                                    others=spot_ps.candidates() if spot_ps else ())
                if spot_ps is not None:
                    spot_ps.tick(now, picked)
                members.expire(now)
                if not self._holding():
                    for w in self.members.arrive(now):
                        inflight[self._submit(w)] = w
                if not self.workers and not self.members.pending and not self.members.starting:
                    raise TransientError("every worker was lost and --replace none: no worker left to train "
                                         f"(resume from the checkpoint with --resume {self.run_id})")
                self._settle_state()
            self.detached.reap()
            self.duties.collect()  # checkpoints stored in the background meanwhile
            if now >= next_stats and not parked:  # a parked shard has no actor to ask
                self._collect_shard_stats()
                next_stats = now + SHARD_STATS_EVERY_S
            if finished:
                continue
            if self._shard_failed:
                if not inflight and not duties:
                    self._restore_shards()
                    self.schedule.restart(self.global_step)
                    for w in self.workers.values():
                        inflight[self._submit(w)] = w
                continue
            if self._holding():
                if not inflight and not duties:  # quiesced: no push in flight, no chief duty running
                    # a worker revoked while the run held has no chunk in flight to fail: it is found lost
                    # when its next chunk (below) fails, and it takes no layout change meanwhile
                    actors = [w.actor for w in self.workers.values() if w.revoked_at is None]
                    if self._planned:
                        self.placement_changes.migrate(self._planned, actors, self.global_step)
                        self._planned = []
                    if spot_ps is not None:
                        spot_ps.carry_out(actors, self.global_step)
                    for w in self.workers.values() if not parked else ():  # parked: wait for the replacement
                        inflight[self._submit(w)] = w
                continue
            chief = self.members.chief
            if chief is not None and not duties:
                self._start_due_duty(chief)

    def _holding(self) -> bool:
        """Whether workers get no new work: placement changes or a PS evacuation wait for the boundary."""
        return bool(self._planned) or (self.ps_servers is not None and self.ps_servers.holding)

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
        self.shard_group.add_waits(res.shard_wait_s)
        self.placement_changes.observe_chunk(res.worker_id, res.steps, res.duration_s, res.compute_s)
        self.members.observe_step_time(w, res.steps, res.duration_s)
        if res.steps:
            speed = self.metrics.window_speed(including=(now, self.global_step))
            self.emitter.emit("on_step", StepReport(self.run_id, now, self.global_step, res.worker_id, res.steps,
                                                    res.duration_s, res.loss, speed, res.compute_s, res.comm_s,
                                                    res.staleness))

    # -- shards ----------------------------------------------------------------------------------
    def _num_shards(self) -> int:
        return len(self.shards)

    def _shard_lost(self) -> None:
        self._shard_failed = True

    def _restore_shards(self) -> None:
        """Replace dead shards and roll every shard back to the latest checkpoint."""
        assert self._initial is not None
        self.duties.collect(wait=True, timeout_s=UPLOAD_DRAIN_S)  # roll back to the newest stored checkpoint
        step, details = self.shard_group.restore(self.storage, self._initial, self.global_step,
                                            [w.actor for w in self.workers.values() if w.revoked_at is None])
        self.global_step = step
        self._shard_failed = False
        self.emitter.event("shard_restored", details=details)
        if self.ps_servers is not None:
            self.ps_servers.sync()

    def _collect_shard_stats(self) -> None:
        if self.placement_changes.collect_stats(self.global_step) is None:
            self._shard_failed = True

    def _final_duties(self) -> None:
        """Final evaluation and checkpoint by the chief (by the next chief if it dies meanwhile)."""
        self._collect_shard_stats()
        self.duties.run_final(lambda: self.members.chief, checkpoint=bool(self.spec.checkpoint_every),
                              timeout_s=UPLOAD_DRAIN_S)

    # -- the end ---------------------------------------------------------------------------------
    def _summary(self, status: str, t_start: float) -> RunSummary:
        duties = self.duties
        return self.metrics.summary(self.run_id, status, t_start, self.global_step, self.provider.servers,
                                    duties.last_accuracy if duties else None, duties.last_loss if duties else None,
                                    planned_workers=self.spec.workers, emulated=self.emulated,
                                    checkpoint_dir=self.storage.uri,
                                    failed_checkpoints=duties.failed_uploads if duties else 0)

    def _shutdown(self) -> None:
        left_running = [*self._inflight, *self._duties]
        self._inflight, self._duties = {}, {}
        release_run((self.members, self.shard_group), self.detached, left_running, self.provider, self._started_ray)


def train(spec: TrainSpec | None = None, callbacks: Sequence[TrainCallback] = (), **kwargs: Any) -> RunSummary:
    """Run one training job (the Python API behind ``cmdare train``).

    Example:
        >>> from cmdare.train import TrainSpec, train
        >>> summary = train(TrainSpec(model="resnet8", steps=100))  # doctest: +SKIP
    """
    return Trainer(spec or TrainSpec(), callbacks, **kwargs).run()


__all__ = ["Trainer", "WorkerHandle", "new_run_id", "train"]
