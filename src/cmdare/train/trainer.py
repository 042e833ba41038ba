"""The coordinator: starts shards and workers, drives chunks of steps, runs the chief's duties.

State of a run (the driver's loop)::

    starting -> running -> finishing -> finished
                   |  ^
                   v  |           (quiesced: no chunk in flight; migrations, shard changes)
                 quiesced

Workers run chunks of steps; when a chunk returns, the coordinator records it and hands the worker
another, until the shards report the target step. Checkpoints and evaluations are calls on the
chief worker between its chunks.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cmdare import __version__
from cmdare.errors import CheckpointError, UserInputError
from cmdare.paths import checkpoint_root
from cmdare.ps.blocks import ParamInfo, param_infos
from cmdare.ps.layout import shard_arrays_from_model_flat
from cmdare.ps.placement import Placement, get_placement
from cmdare.ps.shard import AsyncShardActor, BlockData, SyncShardActor
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
from cmdare.train.spec import TrainSpec
from cmdare.train.worker import ChunkResult, Worker

SHARD_STATS_EVERY_S = 2.0
SPEED_WINDOW_S = 5.0


def new_run_id() -> str:
    """A readable unique run id, e.g. ``run-20261129-201500-ab12``."""
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@dataclass
class WorkerHandle:
    """A running worker: its actor, data slot and whether it is the chief."""

    worker_id: int
    slot: int
    actor: Any


class Trainer:
    """Runs one :class:`TrainSpec` on Ray and reports through callbacks.

    Args:
        spec: the run's configuration.
        callbacks: measurement hooks (store recorder, TensorBoard, progress bar).
        address: join this Ray cluster (``"auto"`` on a cluster node) instead of starting one.
        run_id: the run's id (default: a new one).
        resume: continue run ``run_id`` from its latest checkpoint (or from ``resume_from``).
        checkpoint_dir: where checkpoints go (default: the data directory's ``checkpoints/RUN``).
    """

    def __init__(self, spec: TrainSpec, callbacks: Sequence[TrainCallback] = (), *,
                 address: str | None = None, run_id: str | None = None, resume: bool = False,
                 resume_from: str | Path | None = None, checkpoint_dir: str | Path | None = None):
        self.spec = spec
        self.callbacks = list(callbacks)
        self.address = address
        if resume and run_id is None and resume_from is None:
            raise UserInputError("resume needs the run id or a checkpoint path")
        self.resuming = resume or resume_from is not None
        self.run_id = run_id or new_run_id()
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else checkpoint_root() / self.run_id
        self.resume_from = Path(resume_from) if resume_from else None
        self.shards: list[Any] = []
        self.workers: list[WorkerHandle] = []
        self.chief: WorkerHandle | None = None
        self.placement: Placement | None = None
        self.infos: list[ParamInfo] = []
        self.global_step = 0
        self._started_ray = False
        self._speed = collections.deque()  # (time, global_step)
        self.last_accuracy: float | None = None
        self._first_chunk_at: float | None = None
        self._first_chunk_step = 0
        self._last_chunk_at: float | None = None
        self.last_loss: float | None = None

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
        return params, momentum, buffers, step

    def _start_shards(self, params: np.ndarray, momentum: np.ndarray, step: int) -> None:
        import ray

        spec = self.spec
        self.placement = get_placement(spec.placement).place(self.infos, spec.ps)
        values = shard_arrays_from_model_flat(params, self.infos, self.placement)
        moms = shard_arrays_from_model_flat(momentum, self.infos, self.placement)
        opts = {"num_cpus": spec.cpus_per_shard, "max_restarts": 0}
        if spec.sync:
            cls = ray.remote(SyncShardActor).options(**opts)
            self.shards = [cls.remote(k, spec.optimizer, spec.steps, spec.workers) for k in range(spec.ps)]
        else:
            cls = ray.remote(AsyncShardActor).options(**opts)
            self.shards = [cls.remote(k, spec.optimizer, spec.steps) for k in range(spec.ps)]
        ray.get([s.load.remote(BlockData(tuple(self.placement.blocks_on(k)), values[k], moms[k], step))
                 for k, s in enumerate(self.shards)])

    def _start_worker(self, worker_id: int, slot: int, start_step: int = 0) -> WorkerHandle:
        import ray

        spec = self.spec
        threads = max(1, int(spec.cpus_per_worker)) if spec.cpus_per_worker else None
        cls = ray.remote(Worker).options(num_cpus=spec.cpus_per_worker, num_gpus=spec.gpus_per_worker,
                                         max_restarts=0)
        actor = cls.remote(worker_id, slot, spec.workers, spec, self.shards, self.placement, threads, start_step)
        return WorkerHandle(worker_id, slot, actor)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Train to ``spec.steps``; always reports ``on_run_end``, also on failure."""
        import ray

        spec = self.spec
        params, momentum, buffers, step = self._prepare()
        need_cpus = spec.workers * spec.cpus_per_worker + spec.ps * spec.cpus_per_shard
        self._started_ray = ensure_ray(self.address, num_cpus=max(os.cpu_count() or 1, int(np.ceil(need_cpus))))
        t_start = time.time()
        info = RunInfo(self.run_id, dict(spec.to_dict(), checkpoint_dir=str(self.checkpoint_dir)), t_start,
                       code_version=__version__, resumed_from_step=step)
        self._emit("on_run_start", info)
        status = "failed"
        try:
            self._start_shards(params, momentum, step)
            self.workers = [self._start_worker(i, i, step) for i in range(spec.workers)]
            self.chief = self.workers[0]
            if buffers:
                ray.get([w.actor.load_buffers.remote(buffers) for w in self.workers])
            self.global_step = step
            if self.resuming:
                self._event("resume", details={"step": step})
            self._loop()
            self._final_duties()
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            wall = time.time() - t_start
            summary = RunSummary(self.run_id, time.time(), status, self.global_step, wall, self._mean_speed(),
                                 self.last_accuracy, self.last_loss,
                                 details={"checkpoint_dir": str(self.checkpoint_dir),
                                          "startup_s": (self._first_chunk_at or time.time()) - t_start})
            self._emit("on_run_end", summary)
            self._shutdown()
        return summary

    def _loop(self) -> None:
        import ray

        spec = self.spec
        next_ckpt = _next_multiple(self.global_step, spec.checkpoint_every)
        next_eval = _next_multiple(self.global_step, spec.eval_every)
        next_stats = time.time() + SHARD_STATS_EVERY_S
        inflight = {w.actor.run_steps.remote(spec.chunk_steps, spec.chunk_s): w for w in self.workers}
        finished = False
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                w = inflight.pop(ref)
                res: ChunkResult = ray.get(ref)
                self._record_chunk(res)
                finished = finished or res.done or self.global_step >= spec.steps
                if not finished:
                    inflight[w.actor.run_steps.remote(spec.chunk_steps, spec.chunk_s)] = w
            if time.time() >= next_stats:
                self._collect_shard_stats()
                next_stats = time.time() + SHARD_STATS_EVERY_S
            if finished:
                continue
            if next_ckpt and self.global_step >= next_ckpt and self.global_step < spec.steps:
                self._checkpoint()
                next_ckpt = _next_multiple(self.global_step, spec.checkpoint_every)
            if next_eval and self.global_step >= next_eval and self.global_step < spec.steps:
                self._evaluate()
                next_eval = _next_multiple(self.global_step, spec.eval_every)

    def _final_duties(self) -> None:
        self._collect_shard_stats()
        self._evaluate()
        if self.spec.checkpoint_every:
            self._checkpoint()

    # -- chief duties --------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        import ray

        assert self.chief is not None
        meta = {"run_id": self.run_id, "spec": self.spec.to_dict()}
        res = ray.get(self.chief.actor.checkpoint.remote(str(self.checkpoint_dir), self.infos, meta))
        self._emit("on_checkpoint", CheckpointReport(self.run_id, time.time(), res["step"], self.chief.worker_id,
                                                     res["path"], res["size_bytes"], res["duration_s"],
                                                     res["num_tensors"]))

    def _evaluate(self) -> None:
        import ray

        assert self.chief is not None
        acc, loss, step = ray.get(self.chief.actor.evaluate.remote())
        self.last_accuracy, self.last_loss = acc, loss
        self._emit("on_eval", EvalReport(self.run_id, time.time(), step, self.chief.worker_id, acc, loss))

    # -- measurement ---------------------------------------------------------------------------
    def _mean_speed(self) -> float:
        """Global steps/s from the first reported chunk to the last (start-up excluded)."""
        if self._first_chunk_at is None or self._last_chunk_at is None:
            return 0.0
        span = self._last_chunk_at - self._first_chunk_at
        return (self.global_step - self._first_chunk_step) / span if span > 0 else 0.0

    def _record_chunk(self, res: ChunkResult) -> None:
        now = time.time()
        if self._first_chunk_at is None:
            # The first chunk's own steps count from its start, estimated from its duration.
            self._first_chunk_at = now - res.duration_s
            self._first_chunk_step = self.global_step
        self._last_chunk_at = now
        self.global_step = max(self.global_step, res.global_step)
        self._speed.append((now, self.global_step))
        while len(self._speed) > 2 and now - self._speed[0][0] > SPEED_WINDOW_S:
            self._speed.popleft()
        (t0, s0), (t1, s1) = self._speed[0], self._speed[-1]
        speed = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
        if res.steps:
            self._emit("on_step", StepReport(self.run_id, now, self.global_step, res.worker_id, res.steps,
                                             res.duration_s, res.loss, speed, res.compute_s, res.comm_s,
                                             res.staleness))

    def _collect_shard_stats(self) -> None:
        import ray

        stats = ray.get([s.stats.remote() for s in self.shards])
        now = time.time()
        for st in stats:
            self._emit("on_shard", ShardReport(self.run_id, now, self.global_step, st.shard_id, st.pushes,
                                               st.bytes_in, st.bytes_out, st.busy_s, st.num_params))

    def _event(self, kind: str, **fields: Any) -> None:
        self._emit("on_event", EventReport(self.run_id, time.time(), kind, self.global_step, **fields))

    def _emit(self, hook: str, report: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(report)

    def _shutdown(self) -> None:
        import ray

        for handle in [w.actor for w in self.workers] + list(self.shards):
            with contextlib.suppress(Exception):  # already gone
                ray.kill(handle)
        if self._started_ray:
            ray.shutdown()


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
