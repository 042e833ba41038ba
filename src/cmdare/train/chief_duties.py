"""The chief worker's duties: checkpoints and evaluations, as calls the coordinator awaits in its loop.

A duty is a call on the chief; while it runs the loop goes on (so a revocation is noticed meanwhile).
A chief lost during a duty is handled like any loss, and the duty is retried by the next chief.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cmdare.errors import ShardLostError
from cmdare.events import CheckpointReport, EvalReport
from cmdare.ps.blocks import ParamInfo
from cmdare.train.emitter import RunEmitter
from cmdare.train.faults import classify

__all__ = ["ChiefDuties"]


class ChiefDuties:
    """Starts and records the chief's checkpoints and evaluations.

    Args:
        checkpoint_dir: where checkpoints go.
        meta: what every checkpoint records besides the parameters (run id, spec).
        infos: the model's parameter layout.
        emitter: reports ``on_eval`` and ``on_checkpoint``.
        on_lost: called with (worker handle, error) when the chief died during a duty.
        on_shard_lost: called when a shard died under the duty.
    """

    def __init__(self, checkpoint_dir: Path, meta: dict[str, Any], infos: list[ParamInfo], emitter: RunEmitter,
                 on_lost: Callable[[Any, Exception], None], on_shard_lost: Callable[[], None]):
        self.checkpoint_dir, self.meta, self.infos, self.emitter = checkpoint_dir, meta, infos, emitter
        self.on_lost, self.on_shard_lost = on_lost, on_shard_lost
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None

    def start(self, kind: str, chief: Any) -> Any:
        """Start duty ``kind`` (``"checkpoint"`` or ``"eval"``) on ``chief``; returns its reference."""
        if kind == "eval":
            return chief.actor.evaluate.remote()
        return chief.actor.checkpoint.remote(str(self.checkpoint_dir), self.infos, self.meta)

    def finish(self, kind: str, chief: Any, ref: Any) -> bool:
        """Record a finished duty. Returns False when it failed (the chief or a shard died meanwhile)."""
        import ray

        try:
            res = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if isinstance(classify(err, chief.worker_id), ShardLostError):
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
            self.emitter.emit("on_checkpoint", CheckpointReport(run_id, now, res["step"], chief.worker_id, res["path"],
                                                                res["size_bytes"], res["duration_s"],
                                                                res["num_tensors"]))
        return True

    def run_now(self, kind: str, chief: Any) -> bool:
        """Start and await duty ``kind`` on ``chief``."""
        return self.finish(kind, chief, self.start(kind, chief))
