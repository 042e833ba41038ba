"""The trainer: a training run on Ray, decided by the run controller and carried out by the Ray driver.

It prepares the run (storage, parameters fresh or resumed, the revocation source), starts the shards
(:class:`~cmdare.train.ps.shard_group.ShardGroup`), builds the controller (:class:`~cmdare.control.RunController`,
from :func:`~cmdare.train.run.controller_setup.run_config` and the policy kernels) and the executors, runs the Ray
driver (:class:`~cmdare.train.run.ray_driver.RayDriver`) to the run's end and reports it. Its states are the
controller's (:class:`~cmdare.control.run_state.RunState`)::

    starting -> running -> finishing -> finished          (any state -> failed on a final error)
                 |   ^
      revocation |   | replacement joined / chief re-elected / shards restored
                 v   |
          degraded / restoring

A local run emulates cloud servers on the controller's emulated clock, which advances with training; a run
joined to a real cluster (``address``) runs on the wall clock and on what the cluster does.
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
from cmdare.collective import Rendezvous
from cmdare.control import NoRevocations, RunController, RunState, build_revocation_source
from cmdare.control.balancers import DecisionSource
from cmdare.control.mitigation import placement_sources
from cmdare.errors import ClusterError, RunInterruptedError, StorageError, TransientError, UserInputError
from cmdare.events import RunInfo, RunSummary, TrainCallback
from cmdare.ps.blocks import ParamInfo
from cmdare.storage import Storage
from cmdare.train.allreduce.allreduce_driver import AllReduceDriver
from cmdare.train.allreduce.group_duties import GroupDuties
from cmdare.train.allreduce.member_executor import MemberExecutor
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore
from cmdare.train.duties.checkpoint_uploads import CheckpointUploads
from cmdare.train.duties.chief_duties import ChiefDuties
from cmdare.train.ps.placement_changes import PlacementChanges
from cmdare.train.ps.ps_evacuation import PsServerExecutor, ps_executor
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.run.controller_setup import build_controller
from cmdare.train.run.driver_loop import DriverLoop
from cmdare.train.run.gpu_speeds import emulated_step_stretch
from cmdare.train.run.ray_driver import UPLOAD_DRAIN_S, RayDriver
from cmdare.train.run.ray_session import JoinedCluster, check_joined, ensure_ray
from cmdare.train.run.run_metrics import RunMetrics
from cmdare.train.run.run_start import (
    InitialState,
    gpus_per_worker,
    initial_state,
    joined_storage_warning,
    preflight,
    training_storage,
)
from cmdare.train.run.stop_signals import StopSignals
from cmdare.train.run.teardown import release_run
from cmdare.train.runtime.cluster_health import LoopWatchdog
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.runtime.run_files import new_run_id, write_run_spec, write_status
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.worker_executor import WorkerExecutor
from cmdare.train.workers.worker_handle import WorkerHandle


class Trainer:
    """Runs one :class:`TrainSpec` on Ray and reports through callbacks.

    Args:
        spec: the run's configuration.
        callbacks: measurement hooks (store recorder, TensorBoard, progress bar).
        address: join this Ray cluster (``"auto"`` on a cluster node) instead of starting one; a cluster that
            no cmdare config started is refused unless ``any_cluster``.
        run_id: the run's id (default: a new one).
        resume: continue run ``run_id`` from its latest checkpoint (or from ``resume_from``, or from the
            checkpoint of step ``resume_step``).
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
                 background_uploads: bool = True, resume_step: int | None = None, any_cluster: bool = False):
        if resume and run_id is None and resume_from is None:
            raise UserInputError("resume needs the run id or a checkpoint path")
        self.spec = spec
        self.address, self.any_cluster = address, any_cluster
        self.resuming = resume or resume_from is not None
        self.run_id = run_id or new_run_id()
        self.storage = training_storage(spec, self.run_id, checkpoint_dir)
        self.storage_warning = joined_storage_warning(address, spec, checkpoint_dir)
        self.background_uploads = background_uploads
        self.resume_from = Path(resume_from) if resume_from else None
        self.resume_step = resume_step
        self.plan, self.worker_specs, self.ps_spec = preflight(spec)  # unknown names fail here, before anything starts
        from cmdare.predict import startup_model  # loaded when a phase is first sampled

        startup = StartupDelay(spec.startup, self.plan.speedup, spec.seed, model=startup_model)
        if provider is None:
            provider = RayClusterProvider(startup) if address else LocalProcessProvider(startup)
        self.provider = provider
        if provider.emulated:  # emulated servers are billed in the run's emulated cloud time, not the wall's
            provider.cloud_clock = lambda: self.controller.now if self.controller is not None else 0.0
        self.decisions = decisions
        self.metrics = RunMetrics()
        self.emitter = RunEmitter(self.run_id, [self.metrics, *callbacks], lambda: self.global_step)
        self.detached = DetachedCalls()
        self.controller: RunController | None = None
        self._first_step = 0
        self._saved_controller: dict[str, Any] = {}  # the controller's state stored with the checkpoint resumed
        self.infos: list[ParamInfo] = []
        self._started_ray = False
        self.emulated = self.provider.kind != "ray"
        self.shard_group: ShardGroup | None = None  # set up once Ray is
        self.members: WorkerExecutor | None = None
        self.duties: ChiefDuties | None = None
        self.placement_changes: PlacementChanges | None = None
        self.ps_servers: PsServerExecutor | None = None
        self.driver: DriverLoop | None = None
        self.rendezvous: Rendezvous | None = None  # where an all-reduce run's members meet
        self._start: InitialState | None = None  # what the run starts from (fresh, or the checkpoint resumed)
        self._stop_why: str | None = None  # a stop was asked for (request_stop)

    @property
    def global_step(self) -> int:
        """The run's step: the shards' furthest step reported so far."""
        return self.driver.global_step if self.driver is not None else self._first_step

    @property
    def workers(self) -> dict[int, WorkerHandle]:
        """The live workers by id."""
        return self.members.workers if self.members is not None else {}

    @property
    def chief(self) -> WorkerHandle | None:
        """The chief worker (checkpoints and evaluates), if any."""
        return self.members.chief if self.members is not None else None

    @property
    def kernel(self) -> Any:
        """The membership kernel (its timeline records every join, loss, chief and LR change)."""
        return self.controller.kernel if self.controller is not None else None

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
        if not self.resuming:
            stored = CheckpointStore(self.storage).steps()
            if stored:  # a run of this id trained here before: a fresh start would rotate its checkpoints out
                raise UserInputError(f"run {self.run_id} already has checkpoints in {self.storage.uri} (the newest "
                                     f"of step {max(stored)}): resume it (--resume {self.run_id}, or resume=True) "
                                     "or give another run id; nothing was changed")
        start = initial_state(self.spec, self.run_id, self.storage, self.resume_from, self.resuming, self.resume_step)
        self.infos, params, momentum, buffers, step = start[:5]
        self._saved_controller = start.controller
        self._start = start
        write_run_spec(self.storage, self.run_id, self.spec.to_dict())
        source = build_revocation_source(self.plan)
        self._source = source if self.spec.transient or self.spec.ps_transient else NoRevocations()
        return params, momentum, buffers, step

    def _setup(self, params: np.ndarray, momentum: np.ndarray, buffers: dict[str, np.ndarray], step: int) -> None:
        start = self._start  # what the run starts from, as a checkpoint: any optimizer's state, the data position
        position = {"data_position": list(start.data_position)} if start and start.data_position else {}
        initial = Checkpoint(step, params, momentum, buffers or {}, position, start.optimizer if start else {})
        if self.spec.topology == "allreduce":
            self._setup_group(initial)
            return
        spec = self.spec
        self.shard_group = ShardGroup(spec, self.provider, self.ps_spec, self.infos, self.emitter, self.detached)
        self.shard_group.start(initial)
        self.members = WorkerExecutor(spec, self.provider, self.shard_group, self.emitter, self.detached,
                                      self.metrics.window_speed, lambda: self.global_step, buffers or None,
                                      cloud_now=lambda: self.controller.now if self.controller else time.time())
        self.members.num_gpus = gpus_per_worker(spec, joined=not self.provider.emulated)
        if self.provider.emulated and spec.worker_gpus:  # one machine stands in for several GPU types
            self.members.stretch = emulated_step_stretch(spec, self.emitter)
        self.duties = ChiefDuties(*self._checkpoint_uploads(), self.infos, self.emitter, self.shard_group)
        if self.decisions is None:
            self.decisions = placement_sources(self.shard_group.placement, psld=spec.placement == "psld",
                                               elastic=spec.elastic_ps, balance_every=spec.balance_every,
                                               seed=spec.seed, auto_mitigate=spec.auto_mitigate)
        self.placement_changes = PlacementChanges(self.shard_group, self.emitter, self.storage)
        self.ps_servers = ps_executor(spec, self.shard_group, self.placement_changes, self.provider, self.emitter)
        self._first_step = step
        self.controller = build_controller(spec, self.plan, self._source, self.run_id, real=not self.emulated_time,
                                           checkpoints=self.storage.uri, resumed_from=step if self.resuming else None,
                                           balancer=self.decisions, placement=self.shard_group.placement)
        self.controller.restore_state(self._saved_controller)  # a resumed run decides on as the run would have
        self.driver = RayDriver(self.controller, spec, self.storage, self.members, self.shard_group, self.duties,
                                self.placement_changes, self.ps_servers, self.emitter, self.metrics, self.detached,
                                initial, real=not self.emulated_time)
        self.driver.stop_why = self._stop_why  # asked for while the run was setting up

    def _setup_group(self, initial: Checkpoint) -> None:
        """An all-reduce run: the members' rendezvous, their executor and duties, the controller, the driver."""
        spec = self.spec
        host = "127.0.0.1" if not self.address else _own_node_address()
        self.rendezvous = Rendezvous(host)
        self.members = MemberExecutor(spec, self.provider, self.emitter, self.detached, self.metrics.window_speed,
                                      lambda: self.global_step, self.rendezvous.address,
                                      cloud_now=lambda: self.controller.now if self.controller else time.time())
        self.members.num_gpus = gpus_per_worker(spec, joined=not self.provider.emulated)
        self.duties = GroupDuties(*self._checkpoint_uploads(), self.infos, self.emitter)
        step = self._first_step = initial.step
        self.controller = build_controller(spec, self.plan, self._source, self.run_id, real=not self.emulated_time,
                                           checkpoints=self.storage.uri, resumed_from=step if self.resuming else None)
        self.controller.restore_state(self._saved_controller)
        self.driver = AllReduceDriver(self.controller, spec, self.storage, self.members, self.duties, self.emitter,
                                      self.metrics, self.detached, initial, real=not self.emulated_time,
                                      rendezvous=self.rendezvous)
        self.driver.stop_why = self._stop_why

    def _checkpoint_uploads(self) -> tuple[CheckpointUploads, dict[str, Any]]:
        """The run's checkpoint uploads (in the background unless told) and the metadata each checkpoint holds."""
        uploads = CheckpointUploads(CheckpointStore(self.storage, self.spec.keep_checkpoints), self.background_uploads)
        return uploads, {"run_id": self.run_id, "spec": self.spec.to_dict()}

    @property
    def emulated_time(self) -> bool:
        """Whether cloud time is emulated (advancing with training): local providers; a real cluster's is not."""
        return self.provider.emulated

    def _joined_cluster(self) -> JoinedCluster | None:
        """The joined cluster (None on a local run); a cluster cmdare did not start is refused here."""
        if not self.address:
            return None
        try:
            return check_joined(self.address, self.any_cluster)
        except ClusterError:
            if self._started_ray:
                import ray

                ray.shutdown()
            raise

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Train to ``spec.steps``; always reports ``on_run_end``, also on failure."""
        spec = self.spec
        params, momentum, buffers, step = self._prepare()
        shards = spec.ps * spec.cpus_per_shard if spec.topology == "ps" else 0.0
        need_cpus = (spec.workers + spec.warm_spares) * spec.cpus_per_worker + shards
        self._started_ray = ensure_ray(self.address, num_cpus=max(os.cpu_count() or 1, int(np.ceil(need_cpus)) + 2))
        joined = self._joined_cluster()
        t_start = time.time()
        config = dict(spec.to_dict(), checkpoint_dir=self.storage.uri, provider=self.provider.kind)
        # emulated: a local stand-in for cloud servers, or real servers revoked by injection (asked for)
        self.emulated = self.provider.kind != "ray" or not isinstance(self._source, NoRevocations)
        self.emitter.emit("on_run_start", RunInfo(self.run_id, config, t_start, code_version=__version__,
                                                  emulated=self.emulated, resumed_from_step=step))
        applied = spec.shard_optimizer().momentum
        if applied != spec.optimizer.momentum:
            self.emitter.event("async_momentum", details={"momentum": spec.optimizer.momentum, "applied": applied,
                                                          "workers": spec.workers})
        if self._start is not None and self._start.optimizer_dropped:
            self.emitter.event("optimizer_changed", details={"warning": (
                f"the checkpoint was trained with --optimizer {self._start.optimizer_dropped}: its optimizer state "
                f"is not loaded, --optimizer {spec.optimizer_name} starts with fresh state at step {step}")})
        if spec.topology == "allreduce" and len(set(spec.slot_gpus())) > 1:
            self.emitter.event("mixed_gpus", details={"warning": (
                f"--workers {spec.worker_gpus} with --topology allreduce: every step waits for the slowest GPU "
                "(the group trains in lockstep); a parameter server lets each worker train at its own speed")})
        if joined is not None:
            self.emitter.event("cluster_joined", details={"cluster": joined.describe(), "cmdare": joined.is_cmdare})
        if self.storage_warning:
            self.emitter.event("storage_warning", details={"warning": self.storage_warning,
                                                           "storage": self.storage.uri})
        status, at_once = RunState.FAILED, False
        try:
            with StopSignals(self.request_stop, self.run_id):
                self._setup(params, momentum, buffers, step)
                if self.resuming:
                    self.emitter.event("resume", details={"step": step})
                watchdog = LoopWatchdog(_own_node_id(), self._cluster_lost).start()
                try:
                    end = self.driver.run(self.worker_specs, self.ps_spec, watchdog)
                finally:
                    watchdog.stop()
            if end.status == "interrupted":
                status = RunState.INTERRUPTED
                raise RunInterruptedError(f"run {self.run_id} {end.message}")
            if end.status != "finished":
                raise TransientError(end.message or "the run failed")
            status = RunState.FINISHED
        except KeyboardInterrupt:  # a second Ctrl-C: at once, no upload waited for
            status, at_once = RunState.INTERRUPTED, True
            step = self.global_step
            self._close(status, t_start, wait=False)
            raise RunInterruptedError(f"run {self.run_id} stopped at once at step {step}; "
                                      f"{self._resume_hint()}") from None
        finally:
            if not at_once:
                self._close(status, t_start)
        return self._summary_value

    def request_stop(self, why: str = "stopped") -> None:
        """Ask the run to stop at the next step boundary, store the checkpoint of that step and end
        ``interrupted`` (what Ctrl-C and SIGTERM do: :mod:`cmdare.train.run.stop_signals`); ``run`` then raises
        :class:`~cmdare.errors.RunInterruptedError`. Safe from a signal handler or another thread."""
        self._stop_why = self._stop_why or why
        if self.driver is not None:
            self.driver.stop_why = self._stop_why

    def _resume_hint(self) -> str:
        """Where the newest stored checkpoint is and how to resume (read from the storage: an upload the loop has
        not heard of yet counts)."""
        if self.controller is None:
            return ""
        with contextlib.suppress(Exception):  # storage unreachable: what the controller heard of
            stored = CheckpointStore(self.storage).steps()
            return self.controller.config.resume_hint(max(stored) if stored else None)
        return self.controller.config.resume_hint(self.controller.duties.latest_checkpoint())

    def _close(self, status: RunState, t_start: float, wait: bool = True) -> None:
        """Nothing lost on failure: uploads in flight finish first (unless not ``wait``: stopped at once); servers
        end before the run's end is reported (so the store records them); then actors and Ray go."""
        if self.controller is not None and self.controller.state != status:
            with contextlib.suppress(RuntimeError):
                previous = self.controller.state
                if self.controller.machine.to(status):
                    self.emitter.event("run_state", details={"from": str(previous), "to": str(status)})
        if self.duties is not None:
            self.duties.collect(time.time(), wait=wait, timeout_s=UPLOAD_DRAIN_S)
            self.duties.uploads.close()
        for group in (self.members, self.shard_group):
            if group is not None:
                group.release()
        self._summary_value = self._summary(str(status), t_start)
        try:
            write_status(self.storage, str(status), len(self.shards), self.global_step)
        except (OSError, StorageError) as err:  # the run is over all the same: say where its status is missing
            self.emitter.event("storage_warning", details={
                "warning": f"the run's final status ({status}) could not be written to {self.storage.uri} ({err}): "
                           "its status.json there still says it runs", "storage": self.storage.uri})
        self.emitter.emit("on_run_end", self._summary_value)
        left_running = self.driver.take_running() if self.driver is not None else []
        release_run((self.members, self.shard_group), self.detached, left_running, self.provider, self._started_ray)
        if self.rendezvous is not None:
            self.rendezvous.close()

    def _cluster_lost(self, why: str) -> None:
        """The watchdog found the run's Ray node gone, the driver stuck in a Ray call: end the run from here (the
        uploads in flight finish, the status and the store say failed, one line on stderr) and exit with 1."""
        import sys

        hint = self._resume_hint()
        message = f"{why}; {hint}" if hint else why
        with contextlib.suppress(Exception):  # best effort: the process ends either way
            if self.duties is not None:
                self.duties.collect(time.time(), wait=True, timeout_s=60)
            write_status(self.storage, str(RunState.FAILED), len(self.shards), self.global_step)
            self.emitter.event("cluster_lost", details={"reason": why})
            self.emitter.emit("on_run_end", self._summary(str(RunState.FAILED), time.time()))
        print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(1)

    # -- the end ---------------------------------------------------------------------------------
    def _summary(self, status: str, t_start: float) -> RunSummary:
        duties = self.duties
        summary = self.metrics.summary(self.run_id, status, t_start, self.global_step, self.provider.servers,
                                    duties.last_accuracy if duties else None, duties.last_loss if duties else None,
                                    planned_workers=self.spec.workers, emulated=self.emulated,
                                    emulated_time=self.emulated_time, checkpoint_dir=self.storage.uri,
                                    failed_checkpoints=duties.failed_uploads if duties else 0,
                                    cloud_now=self.controller.now if self.controller is not None else None)
        summary.details["clock"] = "emulated" if self.emulated_time else "wall"
        summary.details["resumed_from_step"] = self._first_step
        if duties is not None and duties.last_metrics:
            summary.details["test_metrics"] = dict(duties.last_metrics)
        return summary


def _own_node_address() -> str:
    """This driver's Ray node address (where an all-reduce run's members reach its rendezvous)."""
    import ray

    return str(ray.util.get_node_ip_address())


def _own_node_id() -> str | None:
    """The Ray node this driver runs on (hex), or None when Ray cannot say."""
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - no node to watch
        return None


def train(spec: TrainSpec | None = None, callbacks: Sequence[TrainCallback] = (), **kwargs: Any) -> RunSummary:
    """Run one training job (the Python API behind ``cmdare train``).

    Example:
        >>> from cmdare.train import TrainSpec, train
        >>> summary = train(TrainSpec(model="resnet8", steps=100))  # doctest: +SKIP
    """
    return Trainer(spec or TrainSpec(), callbacks, **kwargs).run()


__all__ = ["Trainer", "WorkerHandle", "new_run_id", "train"]
