"""The coordinator: starts shards and workers, drives chunks of steps, handles membership.

States of a run (the driver's loop)::

    starting -> running -> finishing -> finished          (any state -> failed on a final error)
                 |   ^
      revocation |   | replacement joined / chief re-elected
                 v   |
               degraded (fewer workers; training goes on)

Workers run chunks of steps; when a chunk returns, the coordinator records it and hands the worker
another, until the shards report the target step. Checkpoints and evaluations are calls on the chief
worker, awaited in the same loop, so a revocation is noticed while they run. A worker lost to a
revocation, a notice or a failure is dropped at once; the chief role moves to a survivor; the
replacement policy may start a new server, whose worker takes the lost data slot, pulls the latest
parameters and trains.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cmdare import __version__
from cmdare.cloud.injection import RevocationClock, RevocationPlan
from cmdare.cloud.local import LocalProcessProvider, RayClusterProvider, Server, ServerProvider, StartupDelay
from cmdare.cloud.servers import ServerSpec, cost_usd
from cmdare.errors import CheckpointError, TransientError, UserInputError
from cmdare.paths import checkpoint_root
from cmdare.ps.blocks import ParamInfo, param_infos
from cmdare.ps.layout import shard_arrays_from_model_flat
from cmdare.ps.migration import execute as execute_decisions
from cmdare.ps.placement import Placement, get_placement
from cmdare.ps.psld.decisions import Decision
from cmdare.ps.psld.load import ShardLoad, block_loads
from cmdare.ps.shard import AsyncShardActor, BlockData, SyncShardActor
from cmdare.train.balancing import (
    DecisionSource,
    PsldSource,
    decisions_for_request,
    read_requests,
    write_status,
)
from cmdare.train.callbacks import (
    CheckpointReport,
    EvalReport,
    EventReport,
    RunInfo,
    RunSummary,
    ShardReport,
    StepReport,
    TrainCallback,
)
from cmdare.train.checkpoint import latest_checkpoint, load_checkpoint
from cmdare.train.cluster import ensure_ray
from cmdare.train.membership import Replace, elect_chief, get_replacement_policy, lr_scale
from cmdare.train.mitigation import BottleneckWatch, CompositeSource
from cmdare.train.spec import TrainSpec
from cmdare.train.worker import ChunkResult, Worker

SHARD_STATS_EVERY_S = 2.0
SPEED_WINDOW_S = 5.0
LOOP_TICK_S = 0.05  # how often the loop looks at revocation deadlines and arriving replacements
DETACHED_DRAIN_S = 5.0  # at shutdown: how long to wait for calls on killed actors to fail

log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A readable unique run id, e.g. ``run-20261129-201500-ab12``."""
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@dataclass
class WorkerHandle:
    """A running worker: its actor, data slot and server."""

    worker_id: int
    slot: int
    actor: Any
    server: Server
    revoke_at: float | None = None  # injected revocation deadline
    revoked_at: float | None = None  # when it was revoked (injected) or told to leave (notice)
    replaces: dict[str, Any] | None = None  # the loss this worker replaces (for recovery times)


class Trainer:
    """Runs one :class:`TrainSpec` on Ray and reports through callbacks.

    Args:
        spec: the run's configuration.
        callbacks: measurement hooks (store recorder, TensorBoard, progress bar).
        address: join this Ray cluster (``"auto"`` on a cluster node) instead of starting one.
        run_id: the run's id (default: a new one).
        resume: continue run ``run_id`` from its latest checkpoint (or from ``resume_from``).
        checkpoint_dir: where checkpoints go (default: the data directory's ``checkpoints/RUN``).
        provider: where servers come from (default: one local Ray node, or the joined cluster).
        decisions: who changes the placement while training (default: the PSLD balancer when
            ``spec.placement == "psld"``; ``cmdare ps add|remove`` requests are always honoured).
    """

    def __init__(self, spec: TrainSpec, callbacks: Sequence[TrainCallback] = (), *,
                 address: str | None = None, run_id: str | None = None, resume: bool = False,
                 resume_from: str | Path | None = None, checkpoint_dir: str | Path | None = None,
                 provider: ServerProvider | None = None, decisions: DecisionSource | None = None):
        if resume and run_id is None and resume_from is None:
            raise UserInputError("resume needs the run id or a checkpoint path")
        self.spec = spec
        self.callbacks = list(callbacks)
        self.address = address
        self.resuming = resume or resume_from is not None
        self.run_id = run_id or new_run_id()
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else checkpoint_root() / self.run_id
        self.resume_from = Path(resume_from) if resume_from else None
        self.plan = RevocationPlan.parse(spec.revocations, seed=spec.seed)
        self.replacement = get_replacement_policy(spec.replace)
        lr_scale(spec.lr_policy, 1, 1)  # fail fast on an unknown policy
        self._lr_scale = 1.0
        self.worker_spec, self.ps_spec = _server_specs(spec)
        from cmdare.predict import startup_model  # loaded when a phase is first sampled

        startup = StartupDelay(spec.startup, self.plan.speedup, spec.seed, model=startup_model)
        if provider is None:
            provider = RayClusterProvider(startup) if address else LocalProcessProvider(startup)
        self.provider = provider
        self.decisions = decisions
        self._planned: list[Decision] = []  # placement changes waiting for the workers to quiesce
        self._shard_failed = False  # a shard died: quiesce, then restore every shard from the checkpoint
        self._initial: tuple[np.ndarray, np.ndarray, int] | None = None
        self.migrations = 0
        self._shard_wait: list[float] = []  # per shard: workers' send-to-reply seconds since the last stats
        self.shards: list[Any] = []
        self.shard_servers: list[Server] = []
        self.workers: dict[int, WorkerHandle] = {}
        self.chief: WorkerHandle | None = None
        self.placement: Placement | None = None
        self.infos: list[ParamInfo] = []
        self.global_step = 0
        self.revocations = 0
        self.replacements = 0
        self.lost_worker_s = 0.0
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None
        self._pending: list[tuple[Server, int, dict[str, Any]]] = []  # replacements on their way
        # Calls whose results the coordinator does not wait for (settings pushed to shards and workers, a
        # revoked worker's last chunk). Each is fetched once done: a call on a revoked (killed) actor fails,
        # and a failed result nobody fetches is printed by Ray as an "Unhandled error" traceback.
        self._detached: list[Any] = []
        self._inflight: dict[Any, WorkerHandle] = {}  # the loop's chunk calls, by reference
        self._duties: dict[Any, tuple[str, WorkerHandle]] = {}  # the loop's chief duties, by reference
        self._next_worker_id = 0
        self._started_ray = False
        self._speed: collections.deque = collections.deque()  # (time, global_step)
        self._first_chunk_at: float | None = None
        self._first_chunk_step = 0
        self._last_chunk_at: float | None = None

    # -- set-up --------------------------------------------------------------------------------
    def _prepare(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], int]:
        """Validate names and data on the driver, build the initial parameters (or load them)."""
        import torch

        from cmdare.datasets import load_dataset
        from cmdare.workloads import build_model

        spec = self.spec
        data = load_dataset(spec.dataset, spec.data_dir, image_size=spec.image_size, channels=spec.channels,
                            seed=spec.seed)
        get_placement(spec.placement)  # fail fast on an unknown name
        torch.manual_seed(spec.seed)
        model = build_model(spec.model, num_classes=data.num_classes, in_channels=data.input_shape[0])
        self.infos = param_infos((n, p.shape) for n, p in model.named_parameters())
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
        momentum = np.zeros_like(params)
        buffers: dict[str, np.ndarray] = {}
        step = 0
        if self.resuming:
            path = self.resume_from or latest_checkpoint(self.checkpoint_dir)
            if path is None:
                raise CheckpointError(f"no checkpoint to resume run {self.run_id} in {self.checkpoint_dir}")
            ckpt = load_checkpoint(path)
            if ckpt.params.size != params.size:
                raise CheckpointError(f"checkpoint {path} holds {ckpt.params.size} parameters; model "
                                      f"{spec.model} has {params.size}")
            params, momentum, buffers, step = ckpt.params, ckpt.momentum, ckpt.buffers, ckpt.step
            if step >= spec.steps:
                raise UserInputError(f"run {self.run_id} is already at step {step} >= --steps {spec.steps}")
        if self.plan.lifetime:
            RevocationClock(self.plan)  # fail fast on an unknown or unreadable lifetime model
        return params, momentum, buffers, step

    def _new_shard(self, k: int, server: Server | None = None) -> Any:
        """Start shard actor ``k`` (empty) on a new on-demand PS server."""
        import ray

        spec = self.spec
        server = server or self.provider.request(self.ps_spec)
        self.shard_servers.append(server)
        self._server_event("server_requested", server)
        opts = {"num_cpus": spec.cpus_per_shard, "max_restarts": 0, **self.provider.actor_options(server)}
        if spec.sync:
            actor = ray.remote(SyncShardActor).options(**opts).remote(k, spec.optimizer, spec.steps,
                                                                     max(1, len(self.workers) or spec.workers))
        else:
            actor = ray.remote(AsyncShardActor).options(**opts).remote(k, spec.optimizer, spec.steps)
        server.actor = actor
        if self._lr_scale != 1.0:
            self._detach(actor.set_lr_scale.remote(self._lr_scale))
        if spec.lr_policy == "staleness":
            self._detach(actor.set_staleness_damping.remote(True))
        if spec.ps_bandwidth:
            self._detach(actor.set_link.remote(spec.ps_link_bytes_per_s()))
        return actor

    def _start_shards(self, params: np.ndarray, momentum: np.ndarray, step: int) -> None:
        import ray

        spec = self.spec
        self.placement = get_placement(spec.placement).place(self.infos, spec.ps)
        values = shard_arrays_from_model_flat(params, self.infos, self.placement)
        moms = shard_arrays_from_model_flat(momentum, self.infos, self.placement)
        self.shards = [self._new_shard(k) for k in range(spec.ps)]
        ray.get([s.load.remote(BlockData(tuple(self.placement.blocks_on(k)), values[k], moms[k], step))
                 for k, s in enumerate(self.shards)])
        straggler = spec.straggler_factor()
        if straggler:
            ray.get(self.shards[straggler[0]].set_slowdown.remote(straggler[1]))
        for server in self.shard_servers:
            server.joined_at = time.time()
            self._server_event("server_joined", server)
        if self.decisions is None:
            sources: list[DecisionSource] = []
            if spec.placement == "psld":
                sources.append(PsldSource(self.placement, elastic=spec.elastic_ps, interval_steps=spec.balance_every,
                                          seed=spec.seed))
            sources.append(BottleneckWatch(lambda kind, details: self._event(kind, details=details),
                                           auto=spec.auto_mitigate))
            self.decisions = CompositeSource(sources)

    def _start_worker(self, server: Server, slot: int, start_step: int) -> WorkerHandle:
        import ray

        spec = self.spec
        self.provider.prepare(server)
        threads = max(1, int(spec.cpus_per_worker)) if spec.cpus_per_worker else None
        opts = {"num_cpus": spec.cpus_per_worker, "num_gpus": spec.gpus_per_worker, "max_restarts": 0,
                **self.provider.actor_options(server)}
        worker_id = self._next_worker_id
        self._next_worker_id += 1
        actor = ray.remote(Worker).options(**opts).remote(
            worker_id, slot, spec.workers, spec, self.shards, self.placement, threads, start_step, server.notice)
        server.actor = actor
        handle = WorkerHandle(worker_id, slot, actor, server)
        if spec.transient:
            handle.revoke_at = self._clock.deadline(server.ready_at) if self._clock else None
        self.workers[worker_id] = handle
        return handle

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Train to ``spec.steps``; always reports ``on_run_end``, also on failure."""
        import ray

        spec = self.spec
        params, momentum, buffers, step = self._prepare()
        need_cpus = spec.workers * spec.cpus_per_worker + spec.ps * spec.cpus_per_shard
        self._started_ray = ensure_ray(self.address, num_cpus=max(os.cpu_count() or 1, int(np.ceil(need_cpus)) + 2))
        self._clock = RevocationClock(self.plan) if (self.plan.enabled and spec.transient) else None
        t_start = time.time()
        config = dict(spec.to_dict(), checkpoint_dir=str(self.checkpoint_dir), provider=self.provider.kind)
        info = RunInfo(self.run_id, config, t_start, code_version=__version__,
                       emulated=self.provider.kind != "ray", resumed_from_step=step)
        self._emit("on_run_start", info)
        status = "failed"
        try:
            self._initial = (params, momentum, step)
            self._start_shards(params, momentum, step)
            self.global_step = step
            for slot in range(spec.workers):
                server = self.provider.request(self.worker_spec)
                server.ready_at = server.requested_at  # initial servers: start-up is not part of the run
                self._server_event("server_requested", server)
                self._start_worker(server, slot, step)
            self.chief = self.workers[elect_chief(self.workers)]
            if buffers:
                ray.get([w.actor.load_buffers.remote(buffers) for w in self.workers.values()])
            if self.resuming:
                self._event("resume", details={"step": step})
            self._loop(t_start)
            self._final_duties()
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            summary = self._summary(status, t_start)
            with contextlib.suppress(OSError):
                write_status(self.checkpoint_dir, status, len(self.shards), self.global_step)
            self._emit("on_run_end", summary)
            self._shutdown()
        return summary

    def _loop(self, t_start: float) -> None:
        import ray

        spec = self.spec
        next_ckpt = _next_multiple(self.global_step, spec.checkpoint_every)
        next_eval = _next_multiple(self.global_step, spec.eval_every)
        next_stats = time.time() + SHARD_STATS_EVERY_S
        next_balance = self.global_step + spec.balance_every
        # kept on the trainer: when the loop ends on an error, _shutdown fetches the calls still running
        inflight: dict[Any, WorkerHandle] = self._inflight
        duties: dict[Any, tuple[str, WorkerHandle]] = self._duties
        for w in self.workers.values():
            inflight[self._submit(w)] = w
        finished = False
        write_status(self.checkpoint_dir, "running", len(self.shards), self.global_step)
        while inflight or duties or self._planned or self._shard_failed or (not finished and self._pending):
            ready, _ = ray.wait(list(inflight) + list(duties), num_returns=1, timeout=LOOP_TICK_S)
            for ref in ready:
                if ref in duties:
                    kind, w = duties.pop(ref)
                    self._finish_duty(kind, w, ref)
                    continue
                w = inflight.pop(ref)
                try:
                    res: ChunkResult = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    if isinstance(err, ray.exceptions.RayTaskError):  # raised inside a live worker: a shard died
                        self._shard_failed = True
                    else:
                        self._on_worker_lost(w, err)
                    continue
                self._record_chunk(w, res)
                finished = finished or res.done or self.global_step >= spec.steps
                if not finished and not self._planned:
                    # Decide at a chunk boundary, before handing out more work: in synchronous mode every
                    # worker returns from the same round, so none is left waiting at a shard's barrier.
                    self._planned = self._poll_decisions(self.global_step >= next_balance)
                    if self.global_step >= next_balance:
                        next_balance = self.global_step + spec.balance_every
                if res.notice is not None:
                    self._on_notice(w, res.notice)
                elif not finished and not self._planned and not self._shard_failed:
                    inflight[self._submit(w)] = w
            now = time.time()
            if finished:  # a revoked worker's last chunk may take Ray's node-death timeout to fail: skip it
                self._planned = []
                for ref, w in [(r, w) for r, w in inflight.items() if w.revoked_at is not None]:
                    del inflight[ref]
                    self._detach(ref)  # fetched (its expected failure discarded) once Ray reports it
                    self._on_worker_lost(w, None, replace=False)
            else:
                self._inject_revocations(now)
                if not self._planned:
                    for w in self._arrive_replacements(now):
                        inflight[self._submit(w)] = w
                if not self.workers and not self._pending:
                    raise TransientError("every worker was lost and --replace none: no worker left to train "
                                         f"(resume from the checkpoint with --resume {self.run_id})")
            self._reap_detached()
            if now >= next_stats:
                self._collect_shard_stats()
                next_stats = now + SHARD_STATS_EVERY_S
            if finished:
                continue
            if self._shard_failed:
                if not inflight and not duties:
                    self._restore_shards()
                    next_ckpt = _next_multiple(self.global_step, spec.checkpoint_every)
                    next_eval = _next_multiple(self.global_step, spec.eval_every)
                    for w in self.workers.values():
                        inflight[self._submit(w)] = w
                continue
            if self._planned:
                if not inflight and not duties:  # quiesced: no push in flight, no chief duty running
                    self._migrate(self._planned)
                    self._planned = []
                    for w in self.workers.values():
                        inflight[self._submit(w)] = w
                continue
            if self.chief is None or duties:
                continue
            if next_ckpt and next_ckpt <= self.global_step < spec.steps:
                duties[self._checkpoint_ref(self.chief)] = ("checkpoint", self.chief)
                next_ckpt = _next_multiple(self.global_step, spec.checkpoint_every)
            elif next_eval and next_eval <= self.global_step < spec.steps:
                duties[self.chief.actor.evaluate.remote()] = ("eval", self.chief)
                next_eval = _next_multiple(self.global_step, spec.eval_every)

    def _submit(self, w: WorkerHandle) -> Any:
        # Synchronous workers must end chunks on the same round, so chunks end by step count only.
        max_s = float("inf") if self.spec.sync else self.spec.chunk_s
        return w.actor.run_steps.remote(self.spec.chunk_steps, max_s)

    # -- shard loss ----------------------------------------------------------------------------
    def _restore_shards(self) -> None:
        """Replace dead shards and roll every shard back to the latest checkpoint (consistent state)."""
        import ray

        assert self.placement is not None and self._initial is not None
        alive = []
        for s in self.shards:
            ref = s.ping.remote()
            try:
                ray.get(ref, timeout=10)
                alive.append(True)
            except ray.exceptions.RayActorError:
                alive.append(False)
            except ray.exceptions.GetTimeoutError:
                self._detach(ref)
                alive.append(False)
        path = latest_checkpoint(self.checkpoint_dir)
        if path is not None:
            ckpt = load_checkpoint(path)
            params, momentum, step = ckpt.params, ckpt.momentum, ckpt.step
        else:
            params, momentum, step = self._initial
        lost_steps = max(0, self.global_step - step)
        for k, ok in enumerate(alive):
            if not ok:
                server = self.shard_servers[k]
                self._event("shard_lost", shard_id=k, server_id=server.server_id,
                            details={"global_step": self.global_step, "reason": "revoked"})
                self._end_server(server, "revoked")
                self.shards[k] = self._new_shard(k)
                self.shard_servers.insert(k, self.shard_servers.pop())  # keep servers in shard order
        self.shard_servers = [srv for srv in self.shard_servers if srv.alive or srv.actor in self.shards]
        values = shard_arrays_from_model_flat(params, self.infos, self.placement)
        moms = shard_arrays_from_model_flat(momentum, self.infos, self.placement)
        ray.get([s.load.remote(BlockData(tuple(self.placement.blocks_on(k)), values[k], moms[k], step))
                 for k, s in enumerate(self.shards)])
        straggler = self.spec.straggler_factor()
        if straggler and not alive[straggler[0]]:
            ray.get(self.shards[straggler[0]].set_slowdown.remote(straggler[1]))
        ray.get([w.actor.set_layout.remote(self.placement, self.shards) for w in self.workers.values()])
        self.global_step = step
        self._speed.clear()
        self._shard_failed = False
        self._event("shard_restored", details={"checkpoint_step": step, "steps_lost": lost_steps,
                                               "from_checkpoint": path is not None, "dead_shards":
                                               [k for k, ok in enumerate(alive) if not ok]})

    # -- placement changes ---------------------------------------------------------------------
    def _poll_decisions(self, balance_due: bool) -> list[Decision]:
        """Placement changes to make now: queued ``cmdare ps`` requests, then the balancer's."""
        assert self.placement is not None
        planned: list[Decision] = []
        for req in read_requests(self.checkpoint_dir):
            planned.extend(decisions_for_request(req, self.placement))
        if not planned and self.decisions is not None and (balance_due or self.decisions.every_tick):
            if balance_due:
                self._collect_shard_stats()  # closes the current load window (the balancer observes it)
            planned = self.decisions.decide(self.global_step, self.placement)
        return planned

    def _migrate(self, decisions: list[Decision]) -> None:
        """Carry out placement changes on quiesced shards; workers then adopt the new layout."""
        import ray

        assert self.placement is not None
        old_n = len(self.shards)
        result = execute_decisions(decisions, self.shards, self.placement, self._new_shard)
        self.shards, self.placement = result.shards, result.placement
        for actor in result.removed:
            for server in self.shard_servers:
                if server.actor is actor and server.alive:
                    server.ended_at, server.end_reason = time.time(), "removed"
                    self._server_event("server_ended", server, extra={"reason": "removed"})
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.shard_servers = [srv for srv in self.shard_servers if srv.alive]
        t0 = time.perf_counter()
        ray.get([w.actor.set_layout.remote(self.placement, self.shards) for w in self.workers.values()])
        if self.spec.sync:
            ray.get([s.set_num_workers.remote(max(1, len(self.workers))) for s in self.shards])
        ray.get([s.stats.remote() for s in self.shards])  # fresh load windows under the new placement
        self._shard_wait = [0.0] * len(self.shards)
        pause_s = result.pause_s + time.perf_counter() - t0
        if self.decisions is not None:
            self.decisions.applied(result.done, self.placement, result.moved_bytes, pause_s)
        moves = [d for d in result.done if type(d).__name__ == "Move"]
        self.migrations += len(moves)
        kind = "ps_move"
        if len(self.shards) > old_n:
            kind = "ps_add"
        elif len(self.shards) < old_n:
            kind = "ps_remove"
        self._event(kind, details={"moves": len(moves), "moved_bytes": result.moved_bytes, "pause_s": pause_s,
                                   "num_shards": len(self.shards), "rolled_back": result.rolled_back,
                                   "error": result.error, "placement_version": self.placement.version})
        write_status(self.checkpoint_dir, "running", len(self.shards), self.global_step)

    def _final_duties(self) -> None:
        """Final evaluation and checkpoint by the chief (by the next chief if it dies meanwhile)."""
        self._collect_shard_stats()
        for kind in ("eval", "checkpoint") if self.spec.checkpoint_every else ("eval",):
            while self.chief is not None:
                ref = self.chief.actor.evaluate.remote() if kind == "eval" else self._checkpoint_ref(self.chief)
                if self._finish_duty(kind, self.chief, ref):
                    break

    # -- chief duties --------------------------------------------------------------------------
    def _checkpoint_ref(self, chief: WorkerHandle) -> Any:
        meta = {"run_id": self.run_id, "spec": self.spec.to_dict()}
        return chief.actor.checkpoint.remote(str(self.checkpoint_dir), self.infos, meta)

    def _finish_duty(self, kind: str, w: WorkerHandle, ref: Any) -> bool:
        """Record a checkpoint or evaluation; a chief lost meanwhile is handled like any loss.

        Returns False when the chief died before finishing (the next due point, or the caller, retries).
        """
        import ray

        try:
            res = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if isinstance(err, ray.exceptions.RayTaskError):  # the chief lives; a shard it read from died
                self._shard_failed = True
            elif w.worker_id in self.workers:
                self._on_worker_lost(w, err)
            return False
        now = time.time()
        if kind == "eval":
            acc, loss, step = res
            self.last_accuracy, self.last_loss = acc, loss
            self._emit("on_eval", EvalReport(self.run_id, now, step, w.worker_id, acc, loss))
        else:
            self._emit("on_checkpoint", CheckpointReport(self.run_id, now, res["step"], w.worker_id, res["path"],
                                                         res["size_bytes"], res["duration_s"], res["num_tensors"]))
        return True

    # -- membership ----------------------------------------------------------------------------
    def _inject_revocations(self, now: float) -> None:
        """Revoke servers whose injected lifetime ended (only servers whose worker has joined)."""
        if self._clock is None or self._first_chunk_at is None:
            return
        joined = [w for w in self.workers.values() if w.server.joined_at is not None and w.revoked_at is None]
        due = [w for w in joined if w.revoke_at is not None and w.revoke_at <= now]
        if self._clock.periodic_due(now, self._first_chunk_at) and joined:
            pick = joined[int(self._clock.rng.integers(len(joined)))]
            if pick not in due:
                due.append(pick)
        for w in due:
            t_kill = time.time()
            self.revocations += 1
            self.provider.revoke(w.server)
            # The emulated revocation runs on the coordinator's own thread, which can notice nothing while
            # it kills: detection and recovery are timed from the end of the kill (kill_s says how long).
            w.revoked_at = time.time()
            self._event("revocation", worker_id=w.worker_id, server_id=w.server.server_id,
                        details={"source": "injected", "uptime_s": w.server.uptime_s(), "chief": w is self.chief,
                                 "kill_s": w.revoked_at - t_kill})

    def _on_worker_lost(self, w: WorkerHandle, err: Exception | None, replace: bool = True) -> None:
        """Drop a dead worker, re-elect the chief, ask for a replacement (unless the run is done)."""
        if w.worker_id not in self.workers:
            return
        now = time.time()
        del self.workers[w.worker_id]
        if w.revoked_at is None:  # not injected: a real failure or an outside revocation
            w.revoked_at = now
            self.revocations += 1
            self._event("revocation", worker_id=w.worker_id, server_id=w.server.server_id,
                        details={"source": "failure", "error": type(err).__name__ if err else "unreachable"})
        detection_s = now - w.revoked_at
        self._end_server(w.server, "revoked")
        self._event("worker_lost", worker_id=w.worker_id, server_id=w.server.server_id,
                    details={"detection_delay_s": detection_s, "steps_per_s_before": self._window_speed(),
                             "reason": "revoked", "detected": err is not None})
        self._after_departure(w, replace)

    def _on_notice(self, w: WorkerHandle, notice: dict[str, Any]) -> None:
        """A preemption notice: checkpoint if chief, hand the role over, leave cleanly, replace."""
        import ray

        w.revoked_at = time.time()
        self.revocations += 1
        self._event("notice", worker_id=w.worker_id, server_id=w.server.server_id,
                    details=dict(notice, chief=w is self.chief))
        if w is self.chief and self.spec.checkpoint_every:
            self._finish_duty("checkpoint", w, self._checkpoint_ref(w))
            if w.worker_id not in self.workers:  # it died while checkpointing: handled as a loss
                return
        ref = w.actor.leave.remote()
        try:
            ray.get(ref, timeout=5)
        except ray.exceptions.GetTimeoutError:
            self._detach(ref)  # still running when the actor is killed below: its failure is fetched later
        except Exception:  # noqa: BLE001 - the server is leaving anyway
            pass
        del self.workers[w.worker_id]
        self._end_server(w.server, "notice")
        with contextlib.suppress(Exception):
            ray.kill(w.actor)
        self._after_departure(w)

    def _after_departure(self, w: WorkerHandle, replace: bool = True) -> None:
        if self.chief is w:
            new = elect_chief(self.workers)
            self.chief = self.workers[new] if new is not None else None
            self._event("chief_change", worker_id=new, details={"from": w.worker_id, "to": new})
        if self.spec.sync:
            n = max(1, len(self.workers))
            for s in self.shards:
                self._detach(s.set_num_workers.remote(n))
        self._membership_changed()
        if not replace:
            return
        decision = self.replacement.decide(w.server.spec)
        lost = {"revoked_at": w.revoked_at, "worker_id": w.worker_id, "speed_before": self._window_speed()}
        if isinstance(decision, Replace):
            server = self.provider.request(decision.spec)
            self._pending.append((server, w.slot, lost))
            startup_s = server.ready_at - server.requested_at
            self._server_event("replacement_requested", server, worker_id=w.worker_id,
                               extra={"replaces": w.server.server_id, "startup_s": startup_s})
        else:
            self.lost_worker_s += max(0.0, time.time() - (w.revoked_at or time.time()))

    def _arrive_replacements(self, now: float) -> list[WorkerHandle]:
        arrived = [p for p in self._pending if p[0].ready_at <= now]
        self._pending = [p for p in self._pending if p[0].ready_at > now]
        out = []
        for server, slot, lost in arrived:
            w = self._start_worker(server, slot, self.global_step)
            w.replaces = lost
            source = self._buffer_source(w)
            if source is not None:
                # Batch-norm running statistics live in the workers, not on the shards: a newcomer starts
                # from the chief's (passed as a reference: the coordinator does not wait), so it evaluates
                # and checkpoints well if it becomes chief soon after joining.
                buffers = source.actor.buffers.remote()
                self._detach(buffers, w.actor.load_buffers.remote(buffers))
            if self.spec.sync:
                for s in self.shards:
                    self._detach(s.set_num_workers.remote(len(self.workers)))
            self._membership_changed()
            if self.chief is None:
                self.chief = w
                self._event("chief_change", worker_id=w.worker_id, details={"from": None, "to": w.worker_id})
            out.append(w)
        return out

    def _buffer_source(self, newcomer: WorkerHandle) -> WorkerHandle | None:
        """The worker a newcomer copies batch-norm statistics from: the chief, else another worker, that
        was not revoked (a revoked worker may still be listed until its loss is detected)."""
        others = [w for w in self.workers.values() if w is not newcomer and w.revoked_at is None]
        if any(w is self.chief for w in others):
            return self.chief
        joined = [w for w in others if w.server.joined_at is not None]
        return min(joined or others, key=lambda w: w.worker_id, default=None)

    def _membership_changed(self) -> None:
        """Apply the learning-rate policy for the new number of active workers."""
        scale = lr_scale(self.spec.lr_policy, len(self.workers), self.spec.workers)
        if scale != self._lr_scale:
            for s in self.shards:
                self._detach(s.set_lr_scale.remote(scale))
            self._event("lr_change", details={"policy": self.spec.lr_policy, "scale": scale,
                                              "from": self._lr_scale, "active_workers": len(self.workers)})
            self._lr_scale = scale

    def _end_server(self, server: Server, reason: str) -> None:
        if server.alive:
            server.ended_at, server.end_reason = time.time(), reason
        self._server_event("server_ended", server, extra={"reason": reason, "uptime_s": server.uptime_s()})

    # -- calls not waited for -------------------------------------------------------------------
    def _detach(self, *refs: Any) -> None:
        """Keep ``refs`` (calls whose results the coordinator does not wait for) until they are fetched."""
        self._detached.extend(refs)

    def _reap_detached(self, timeout_s: float = 0.0) -> None:
        """Fetch the detached calls that are done (waiting up to ``timeout_s`` for all of them).

        A call on a worker or shard that was revoked, removed or killed fails with ``RayActorError``:
        expected, discarded. Any other failure is logged on one line.
        """
        import ray

        if not self._detached:
            return
        ready, self._detached = ray.wait(self._detached, num_returns=len(self._detached), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.TaskCancelledError):
                pass  # the actor is gone (revoked or killed): its pending calls fail, as expected
            except Exception as err:  # noqa: BLE001 - a best-effort call: report, keep training
                last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
                log.warning("a call the coordinator did not wait for failed: %s: %s", type(err).__name__, last)

    # -- measurement ---------------------------------------------------------------------------
    def _window_speed(self) -> float:
        if len(self._speed) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._speed[0], self._speed[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def _mean_speed(self) -> float:
        """Global steps/s from the first reported chunk to the last (start-up excluded)."""
        if self._first_chunk_at is None or self._last_chunk_at is None:
            return 0.0
        span = self._last_chunk_at - self._first_chunk_at
        return (self.global_step - self._first_chunk_step) / span if span > 0 else 0.0

    def _record_chunk(self, w: WorkerHandle, res: ChunkResult) -> None:
        now = time.time()
        if self._first_chunk_at is None:
            self._first_chunk_at = now - res.duration_s
            self._first_chunk_step = self.global_step
        self._last_chunk_at = now
        if w.server.joined_at is None:
            w.server.joined_at = now - res.duration_s
            if w.replaces is not None:
                self.replacements += 1
                recovery_s = w.server.joined_at - w.replaces["revoked_at"]
                self.lost_worker_s += recovery_s
                self._server_event("replacement_joined", w.server, worker_id=w.worker_id,
                                   extra={"recovery_s": recovery_s, "replaces_worker": w.replaces["worker_id"],
                                          "startup_s": w.server.ready_at - w.server.requested_at,
                                          "steps_per_s_before": w.replaces["speed_before"], "steps_lost": 0})
            else:
                self._server_event("server_joined", w.server, worker_id=w.worker_id)
        self.global_step = max(self.global_step, res.global_step)
        self._speed.append((now, self.global_step))
        while len(self._speed) > 2 and now - self._speed[0][0] > SPEED_WINDOW_S:
            self._speed.popleft()
        if len(self._shard_wait) != len(self.shards):
            self._shard_wait = [0.0] * len(self.shards)
        for k, v in enumerate(res.shard_wait_s[:len(self.shards)]):
            self._shard_wait[k] += v
        if res.steps and self.decisions is not None and hasattr(self.decisions, "observe_chunk"):
            self.decisions.observe_chunk(res.worker_id, res.steps, res.duration_s, res.compute_s)
        if res.steps:
            self._emit("on_step", StepReport(self.run_id, now, self.global_step, res.worker_id, res.steps,
                                             res.duration_s, res.loss, self._window_speed(), res.compute_s,
                                             res.comm_s, res.staleness))

    def _collect_shard_stats(self) -> list[Any]:
        """Each shard's counters since the last collection (reported, and returned for the balancer)."""
        import ray

        try:
            stats = ray.get([s.stats.remote() for s in self.shards])
        except ray.exceptions.RayActorError:
            self._shard_failed = True
            return []
        now = time.time()
        waits = self._shard_wait if len(self._shard_wait) == len(stats) else [0.0] * len(stats)
        self._shard_wait = [0.0] * len(stats)
        stats = [dataclasses.replace(st, shard_id=k, wait_s=w)
                 for k, (st, w) in enumerate(zip(stats, waits, strict=True))]
        for k, st in enumerate(stats):
            blocks = tuple(block_loads(ShardLoad.from_stats(st), self.placement)) if self.placement else ()
            self._emit("on_shard", ShardReport(self.run_id, now, self.global_step, k, st.pushes,
                                               st.bytes_in, st.bytes_out, st.busy_s, st.num_params, st.apply_s,
                                               st.queue_s, st.wait_s, blocks))
        if self.decisions is not None:
            self.decisions.observe(stats, self.global_step)
        return stats

    def _server_event(self, kind: str, server: Server, worker_id: int | None = None,
                      extra: dict[str, Any] | None = None) -> None:
        details = server.record()
        if server.joined_at is not None:
            details["joined_at"] = server.joined_at
        details.update(extra or {})
        self._event(kind, worker_id=worker_id, server_id=server.server_id, details=details)

    def _event(self, kind: str, **fields: Any) -> None:
        self._emit("on_event", EventReport(self.run_id, time.time(), kind, self.global_step, **fields))

    def _emit(self, hook: str, report: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(report)

    def _summary(self, status: str, t_start: float) -> RunSummary:
        now = time.time()
        servers = self.provider.servers
        cost = sum(cost_usd(s.spec, s.uptime_s(now)) for s in servers if s.joined_at is not None or not s.alive)
        n = max(1, self.spec.workers)
        return RunSummary(self.run_id, now, status, self.global_step, now - t_start, self._mean_speed(),
                          self.last_accuracy, self.last_loss, self.revocations, self.replacements, cost,
                          details={"checkpoint_dir": str(self.checkpoint_dir),
                                   "startup_s": (self._first_chunk_at or now) - t_start,
                                   "time_lost_s": self.lost_worker_s / n, "emulated": self.provider.kind != "ray",
                                   "servers": len(servers)})

    def _shutdown(self) -> None:
        import ray

        now = time.time()
        for w in list(self.workers.values()):
            if w.server.alive:
                w.server.ended_at, w.server.end_reason = now, "released"
                self._server_event("server_ended", w.server, extra={"reason": "released",
                                                                     "uptime_s": w.server.uptime_s()})
        for server in self.shard_servers:
            if server.alive:
                server.ended_at, server.end_reason = now, "released"
                self._server_event("server_ended", server, extra={"reason": "released"})
        self._detach(*self._inflight, *self._duties)  # left running by a loop that ended on an error
        self._inflight, self._duties = {}, {}
        with contextlib.suppress(Exception):  # Ray itself is failing: nothing left to fetch
            self._reap_detached()
        for handle in [w.actor for w in self.workers.values()] + list(self.shards):
            with contextlib.suppress(Exception):  # already gone
                ray.kill(handle)
        with contextlib.suppress(Exception):
            # calls still pending on the actors just killed fail within moments: fetch (discard) them so
            # that Ray does not print them as unhandled errors when their references are dropped
            self._reap_detached(DETACHED_DRAIN_S)
        self._detached = []
        for server in self.provider.servers:
            self.provider.release(server)
        if self._started_ray:
            ray.shutdown()


def _server_specs(spec: TrainSpec) -> tuple[ServerSpec, ServerSpec]:
    """Worker and PS server specs priced from the catalog (a local run emulates them)."""
    from cmdare.cloud.catalog import default_catalog

    catalog = default_catalog()
    region = spec.region
    if region is None:
        offers = catalog.find(gpu=spec.gpu, cloud=spec.cloud)
        if not offers:
            catalog.offering(spec.gpu, spec.cloud, catalog.regions(spec.cloud)[0])  # raises a clear error
        region = sorted(o.region for o in offers)[0]
    worker = catalog.server_spec(spec.gpu, spec.cloud, region, spec.transient, role="worker")
    ps = catalog.server_spec(None, spec.cloud, region, False, role="ps")
    return worker, ps


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every if every else 0


def train(spec: TrainSpec | None = None, callbacks: Sequence[TrainCallback] = (), **kwargs: Any) -> RunSummary:
    """Run one training job (the Python API behind ``cmdare train``).

    Example:
        >>> from cmdare.train import TrainSpec, train
        >>> summary = train(TrainSpec(model="resnet8", steps=100))  # doctest: +SKIP
    """
    return Trainer(spec or TrainSpec(), callbacks, **kwargs).run()


__all__ = ["Trainer", "WorkerHandle", "new_run_id", "train"]
