"""The chief worker's duties: checkpoints and evaluations, as calls the coordinator awaits in its loop.

A duty is a call on the chief; while it runs the loop goes on (so a revocation is noticed meanwhile).
A chief lost during a duty is handled like any loss, and the duty is retried by the next chief.
A checkpoint duty is the chief's snapshot of the shards; the coordinator then stores the snapshot in
the run's storage in the background (:class:`~cmdare.train.checkpoint_uploads.CheckpointUploads`)
and reports the checkpoint once it is durable (:meth:`ChiefDuties.collect`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cmdare.errors import ShardLostError, TransientError
from cmdare.events import CheckpointReport, EvalReport
from cmdare.ps.blocks import ParamInfo
from cmdare.train.checkpoint_uploads import CheckpointUploads, Upload
from cmdare.train.emitter import RunEmitter
from cmdare.train.faults import classify

__all__ = ["ChiefDuties", "DutySchedule"]


class ChiefDuties:
    """Starts and records the chief's checkpoints and evaluations.

    Args:
        uploads: stores the chief's snapshots (in the background) in the run's storage.
        meta: what every checkpoint records besides the parameters (run id, spec).
        infos: the model's parameter layout.
        emitter: reports ``on_eval`` and ``on_checkpoint``.
        on_lost: called with (worker handle, error) when the chief died during a duty.
        on_shard_lost: called when a shard died under the duty.
    """

    def __init__(self, uploads: CheckpointUploads, meta: dict[str, Any], infos: list[ParamInfo], emitter: RunEmitter,
                 on_lost: Callable[[Any, Exception], None], on_shard_lost: Callable[[], None]):
        self.uploads, self.meta, self.infos, self.emitter = uploads, meta, infos, emitter
        self.on_lost, self.on_shard_lost = on_lost, on_shard_lost
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None
        self.failed_uploads = 0
        self.shard_lost = False  # a duty failed because a shard died
        self._started: dict[Any, tuple[float, float]] = {}  # duty reference -> (perf counter, wall clock)

    def start(self, kind: str, chief: Any) -> Any:
        """Start duty ``kind`` (``"checkpoint"`` or ``"eval"``) on ``chief``; returns its reference."""
        if kind == "eval":
            return chief.actor.evaluate.remote()
        ref = chief.actor.snapshot_checkpoint.remote(self.infos, self.meta)
        self._started[ref] = (time.perf_counter(), time.time())
        return ref

    def finish(self, kind: str, chief: Any, ref: Any) -> bool:
        """Record a finished duty. Returns False when it failed (the chief or a shard died meanwhile)."""
        import ray

        started = self._started.pop(ref, None)
        try:
            res = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if isinstance(classify(err, chief.worker_id), ShardLostError):
                self.shard_lost = True
                self.on_shard_lost()
            else:
                self.on_lost(chief, err)
            return False
        now = time.time()
        run_id = self.emitter.run_id
        if kind == "eval":
            acc, loss, step = res
            self.last_accuracy, self.last_loss = acc, loss
            self.emitter.emit("on_eval", EvalReport(run_id, now, step, chief.worker_id, acc, loss))
        else:
            ckpt, snapshot_s = res
            t0, wall = started or (time.perf_counter(), now)
            upload = Upload(ckpt.step, chief.worker_id, len(self.infos), snapshot_s, time.perf_counter() - t0, wall)
            self.uploads.submit(ckpt, upload)
            self.collect()
        return True

    def collect(self, wait: bool = False, timeout_s: float | None = None) -> None:
        """Report the checkpoints stored since the last call (``wait``: first wait for the uploads in
        flight, at most ``timeout_s``); a failed upload is a ``checkpoint_failed`` event, and the
        previous checkpoint stays the latest."""
        for up in self.uploads.finished(wait=wait, timeout_s=timeout_s):
            if up.saved is None:
                self.failed_uploads += 1
                self.emitter.event("checkpoint_failed", worker_id=up.worker_id,
                                   details={"step": up.step, "error": str(up.error), "upload_s": up.upload_s})
                continue
            self.emitter.emit("on_checkpoint", CheckpointReport(
                self.emitter.run_id, up.started_at + up.duration_s, up.step, up.worker_id, up.saved.url,
                up.saved.size_bytes, up.duration_s, up.num_tensors, stall_s=up.stall_s))

    def run_now(self, kind: str, chief: Any) -> bool:
        """Start and await duty ``kind`` on ``chief``."""
        return self.finish(kind, chief, self.start(kind, chief))

    def run_final(self, chief: Any, checkpoint: bool, timeout_s: float) -> None:
        """The final evaluation (and checkpoint) on ``chief()``, by the next chief if it dies meanwhile; then
        wait up to ``timeout_s`` for the uploads."""
        self.shard_lost = False
        for kind in ("eval", "checkpoint") if checkpoint else ("eval",):
            while chief() is not None:
                if self.run_now(kind, chief()):
                    break
                if self.shard_lost:  # no chief can snapshot a dead shard: the last stored checkpoint stays
                    self.collect(wait=True, timeout_s=timeout_s)
                    raise TransientError(f"a parameter shard died during the final {kind}; the latest stored "
                                         f"checkpoint is kept (resume with --resume {self.emitter.run_id})")
        self.collect(wait=True, timeout_s=timeout_s)


class DutySchedule:
    """When the chief's periodic duties fall due: the next multiples of the checkpoint and evaluation
    intervals (0: never), counted from the step the schedule was (re)started at."""

    def __init__(self, checkpoint_every: int, eval_every: int, steps: int):
        self.every = {"checkpoint": checkpoint_every, "eval": eval_every}
        self.steps = steps
        self.next: dict[str, int] = {}

    def restart(self, global_step: int) -> None:
        """Due next at the multiples after ``global_step`` (at the start, and after the shards rolled back)."""
        self.next = {kind: _next_multiple(global_step, every) for kind, every in self.every.items()}

    def take(self, global_step: int) -> str | None:
        """The duty due at ``global_step`` (checkpoint before evaluation), now scheduled to its next time."""
        for kind, every in self.every.items():
            due = self.next.get(kind, 0)
            if due and due <= global_step < self.steps:
                self.next[kind] = _next_multiple(global_step, every)
                return kind
        return None


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every if every else 0
