"""The Ray executor of the chief's duties: checkpoints and evaluations of the parameters of one step.

The controller starts a duty at a barrier (every worker stopped at the duty's step). The first duty of a
step takes the shards' state right then, before anyone trains on (one snapshot call per shard, awaited): a
checkpoint is those parameters and momentum with batch-norm statistics the chief recomputes for them, an
evaluation runs the chief's model on those parameters and statistics (:mod:`cmdare.tasks.statistics`). A duty
cut short by the chief's loss is run again by the next chief on the same snapshot, so it still holds the step
the schedule named. The snapshot is stored in the run's storage in the background
(:class:`~cmdare.train.duties.checkpoint_uploads.CheckpointUploads`) and the checkpoint reported once durable
(:meth:`ChiefDuties.collect`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.kinds import DutyKind
from cmdare.events import CheckpointReport, EvalReport
from cmdare.ps.blocks import ParamInfo
from cmdare.ps.layout import model_flat_from_shard_arrays, model_optimizer_state
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.duties.checkpoint_uploads import CheckpointUploads, Upload
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.runtime.faults import user_mistake

__all__ = ["SNAPSHOT_TIMEOUT_S", "ChiefDuties", "Snapshot"]

SNAPSHOT_TIMEOUT_S = 120.0  # a shard that does not hand over its state within this is lost


@dataclass
class Snapshot:
    """The shards' parameters and optimizer state of one step (model order), and how long taking them stalled."""

    step: int
    params: np.ndarray
    momentum: np.ndarray
    stall_s: float
    running: int = 0  # duties on it not finished
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)  # an optimizer other than SGD: its state


class ChiefDuties:
    """Starts the chief's duties, records their results, stores the checkpoints."""

    def __init__(self, uploads: CheckpointUploads, meta: dict[str, Any], infos: list[ParamInfo], emitter: RunEmitter,
                 shards: ShardGroup | None):
        self.uploads, self.meta, self.infos, self.emitter, self.shards = uploads, meta, infos, emitter, shards
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None
        self.last_metrics: dict[str, float] = {}
        self.failed_uploads = 0
        self.snapshots: dict[int, Snapshot] = {}
        self.refs: dict[Any, tuple[C.StartDuty, float]] = {}  # duty call -> (its command, when it started)

    def _snapshot(self, step: int) -> Snapshot:
        """The shards' state for a duty of ``step``: taken now, unless a duty of that step took it already."""
        import ray

        snap = self.snapshots.get(step)
        if snap is not None:
            return snap
        t0 = time.perf_counter()
        snaps = ray.get([s.snapshot.remote() for s in self.shards.shards], timeout=SNAPSHOT_TIMEOUT_S)
        blocks = [list(s.blocks) for s in snaps]
        params = model_flat_from_shard_arrays(blocks, [s.params for s in snaps], self.infos)
        momentum = model_flat_from_shard_arrays(blocks, [s.momentum for s in snaps], self.infos)
        optimizer = model_optimizer_state(blocks, [s.optimizer for s in snaps], self.infos)
        taken = min((s.step for s in snaps if s.blocks), default=step)
        snap = self.snapshots[step] = Snapshot(taken, params, momentum, time.perf_counter() - t0, optimizer=optimizer)
        for old in [k for k, s in self.snapshots.items() if k < step and not s.running]:
            del self.snapshots[old]  # a newer step's duties started: nothing re-runs on these
        return snap

    def start(self, cmd: C.StartDuty, chief: Any, wall: float) -> list[E.Event]:
        """Take the step's snapshot (if none yet) and start the duty on the chief's actor."""
        import ray

        try:
            snap = self._snapshot(cmd.step)
        except (ray.exceptions.RayError, TimeoutError):
            return [E.DutyDone(wall=wall, kind=cmd.kind, worker_id=cmd.worker_id, step=cmd.step, ok=False,
                               shard_lost=True, error="a shard did not hand over its state")]
        if chief is None:
            return [E.DutyDone(wall=wall, kind=cmd.kind, worker_id=cmd.worker_id, step=cmd.step, ok=False)]
        snap.running += 1
        ref = chief.actor.statistics.remote(snap.params, snap.step) if cmd.kind == DutyKind.CHECKPOINT else \
            chief.actor.evaluate.remote(snap.params, snap.step)
        self.refs[ref] = (cmd, time.time())
        return []

    def finish(self, ref: Any, wall: float) -> list[E.Event]:
        """A duty call returned: record it (a checkpoint is queued for storage); its chief's failure is the
        controller's to handle."""
        cmd, started = self.refs.pop(ref)
        snap = self.snapshots.get(cmd.step)
        if snap is not None:
            snap.running = max(0, snap.running - 1)
        return self._finished(cmd, started, ref, wall)

    def _finished(self, cmd: C.StartDuty, started: float, ref: Any, wall: float) -> list[E.Event]:
        """The duty's result recorded: an evaluation reported, a checkpoint queued for storage."""
        import ray

        try:
            res = ray.get(ref)
        except ray.exceptions.RayError as err:
            if (said := user_mistake(err)) is not None:  # the user's test data, model or metric failed: any chief would
                return [E.CodeFailed(wall=wall, worker_id=cmd.worker_id, error=said)]
            if not isinstance(err, ray.exceptions.RayActorError):  # raised in a live chief: any chief would raise it
                last = str(err.cause if getattr(err, "cause", None) is not None else err).strip().splitlines()
                return [E.CodeFailed(wall=wall, worker_id=cmd.worker_id,
                                     error=f"the chief's {cmd.kind} of step {cmd.step} failed: "
                                           f"{type(getattr(err, 'cause', err)).__name__}: {last[-1] if last else ''}")]
            return [E.DutyDone(wall=wall, kind=cmd.kind, worker_id=cmd.worker_id, step=cmd.step, ok=False,
                               error=type(err).__name__)]
        run_id = self.emitter.run_id
        if cmd.kind == DutyKind.EVAL:
            result, step = res
            loss = result.loss if result.samples else None  # None: no test data
            self.last_accuracy, self.last_loss, self.last_metrics = result.accuracy, loss, result.metrics
            self.emitter.emit("on_eval", EvalReport(run_id, time.time(), step, cmd.worker_id, result.accuracy,
                                                    result.loss, dict(result.metrics)))
        else:
            meta = dict(self.meta, chief=cmd.worker_id, controller=json.loads(cmd.state) if cmd.state else {})
            made = self._checkpoint(cmd, res, meta)
            if made is None:  # cannot happen: the snapshot is kept while a duty runs on it
                return [E.DutyDone(wall=wall, kind=cmd.kind, worker_id=cmd.worker_id, step=cmd.step, ok=False)]
            ckpt, stall_s = made
            upload = Upload(ckpt.step, cmd.worker_id, len(self.infos), stall_s, time.time() - started, started)
            self.uploads.submit(ckpt, upload)
        loss = self.last_loss if cmd.kind == DutyKind.EVAL else None
        return [E.DutyDone(wall=wall, kind=cmd.kind, worker_id=cmd.worker_id, step=cmd.step, loss=loss),
                *self.collect(wall)]

    def _checkpoint(self, cmd: C.StartDuty, buffers: Any, meta: dict[str, Any]) -> tuple[Checkpoint, float] | None:
        """The checkpoint of the duty's step: the shards' snapshot with the chief's ``buffers`` for it, and how long
        taking the snapshot stalled training (None: no snapshot of that step)."""
        snap = self.snapshots.get(cmd.step)
        if snap is None:
            return None
        return Checkpoint(snap.step, snap.params, snap.momentum, buffers, meta, snap.optimizer), snap.stall_s

    def collect(self, wall: float, wait: bool = False, timeout_s: float | None = None) -> list[E.Event]:
        """Checkpoints stored (or failed) since the last call, reported; ``wait``: first wait for the uploads in
        flight, at most ``timeout_s``."""
        out: list[E.Event] = []
        for up in self.uploads.finished(wait=wait, timeout_s=timeout_s):
            if up.saved is None:
                self.failed_uploads += 1
                self.emitter.event("checkpoint_failed", worker_id=up.worker_id,
                                   details={"step": up.step, "error": str(up.error), "upload_s": up.upload_s})
                out.append(E.CheckpointFailed(wall=wall, step=up.step, error=str(up.error)))
                continue
            self.emitter.emit("on_checkpoint", CheckpointReport(
                self.emitter.run_id, up.started_at + up.duration_s, up.step, up.worker_id, up.saved.url,
                up.saved.size_bytes, up.duration_s, up.num_tensors, stall_s=up.stall_s))
            out.append(E.CheckpointStored(wall=wall, step=up.step))
        return out
