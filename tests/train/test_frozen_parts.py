"""No part of a run freezes it in silence (issue 42): a parameter shard stopped with SIGSTOP held the run at one
step for 160 s with nothing on stderr (the driver's loop sat in a shard call without a time-out, and a probe that
found the shard was followed by another at once, for ever). Now a shard that does not answer within
``SHARD_ANSWER_S`` is said, ended and restored from the newest checkpoint, and the run finishes."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback

pytestmark = pytest.mark.cluster  # waits out the shard's answer time (10 s): the long tier


class _FreezeShard(TrainCallback):
    """Stops shard 0's process (SIGSTOP) once training passes ``at``; continues it at the run's end."""

    def __init__(self, at: int):
        self.at, self.pid, self.events = at, None, []
        self.trainer: Trainer | None = None

    def on_step(self, r):
        if r.global_step >= self.at and self.pid is None:
            import ray

            self.pid = ray.get(self.trainer.shards[0].__ray_call__.remote(lambda _self: os.getpid()))
            os.kill(self.pid, signal.SIGSTOP)

    def on_event(self, r):
        self.events.append(r)

    def on_run_end(self, s):
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # ended by the run, as it should be
                os.kill(self.pid, signal.SIGCONT)


def test_a_frozen_shard_is_said_ended_and_restored_and_the_run_finishes(local_ray, tmp_path):
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=400, batch_size=32, seed=0,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=100, eval_every=0, chunk_steps=5)
    hook = _FreezeShard(at=150)
    trainer = Trainer(spec, [hook], checkpoint_dir=tmp_path)
    hook.trainer = trainer
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 400
    kinds = [e.kind for e in hook.events]
    frozen = [e for e in hook.events if e.kind == "shard_unresponsive"]
    assert len(frozen) == 1 and frozen[0].shard_id == 0, kinds
    lost = [e for e in hook.events if e.kind == "shard_lost"]
    restored = [e for e in hook.events if e.kind == "shard_restored"]
    assert [e.details["reason"] for e in lost] == ["unresponsive"]
    assert [e.details["checkpoint_step"] for e in restored] == [100]  # the newest stored before the freeze
    with pytest.raises(ProcessLookupError):
        os.kill(hook.pid, 0)  # the frozen process was ended, not left behind
