"""A parameter shard lost mid-run: every shard rolls back to the checkpoint and training goes on."""

from __future__ import annotations

from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _KillShard(TrainCallback):
    def __init__(self, at_step: int):
        self.at_step, self.killed_at, self.events, self.steps = at_step, None, [], []
        self.ckpts = []  # (report time, step): reported once stored, which may come after the kill
        self.trainer = None

    def on_step(self, r):
        self.steps.append(r.global_step)
        if self.killed_at is None and r.global_step >= self.at_step:
            import ray

            self.killed_at = r.global_step
            ray.kill(self.trainer.shards[1])  # the shard's server is revoked

    def on_event(self, r):
        self.events.append(r)

    def on_checkpoint(self, r):
        self.ckpts.append((r.time, r.global_step))


def test_lost_shard_is_restored_from_checkpoint_with_others_rolled_back(local_ray, tmp_path):
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=2, steps=200, batch_size=32,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=50, eval_every=0, seed=4, chunk_steps=5)
    cb = _KillShard(at_step=120)
    trainer = Trainer(spec, [cb], checkpoint_dir=tmp_path)
    cb.trainer = trainer
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 200
    lost = [e for e in cb.events if e.kind == "shard_lost"]
    restored = [e for e in cb.events if e.kind == "shard_restored"]
    assert len(lost) == 1 and lost[0].shard_id == 1
    assert len(restored) == 1 and restored[0].details["dead_shards"] == [1]
    ck = restored[0].details["checkpoint_step"]
    # rolled back to the newest checkpoint stored before the restore (its snapshot before the loss: a
    # snapshot needs every shard); the steps after it are reported lost
    stored = [step for t, step in cb.ckpts if t <= restored[0].time]
    assert ck == max(stored) and 50 <= ck <= cb.killed_at
    assert restored[0].details["steps_lost"] >= cb.killed_at - ck
    assert summary.final_accuracy > 0.8
