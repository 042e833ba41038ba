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


def test_a_resumed_run_restores_its_own_timeline_not_a_newer_checkpoint_it_left(local_ray, tmp_path):
    """Resumed from step 50 of a run that stored up to step 150: a shard lost before the resumed run stores a
    checkpoint of its own goes back to step 50 (where this run started), never to the abandoned step 150."""
    from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore
    from cmdare.train.run.run_start import initial_state

    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=2, steps=120, batch_size=32,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=50, eval_every=0, seed=4, chunk_steps=5)
    cb = _KillShard(at_step=60)
    trainer = Trainer(spec, [cb], run_id="r1", checkpoint_dir=tmp_path, resume=True, resume_step=50)
    cb.trainer = trainer
    _infos, params, momentum, *_ = initial_state(spec, "r1", trainer.storage, None, resuming=False)
    store = CheckpointStore(trainer.storage)
    store.save(Checkpoint(50, params, momentum))
    store.save(Checkpoint(150, params + 1.0, momentum))  # the abandoned timeline's newest
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 120
    (restored,) = [e for e in cb.events if e.kind == "shard_restored"]
    assert restored.details["checkpoint_step"] == 50 and not restored.details["from_checkpoint"]
    assert restored.details["steps_lost"] >= cb.killed_at - 50
