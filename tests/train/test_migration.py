"""Live placement changes: moving blocks and adding/removing shards never changes a value."""

from __future__ import annotations

import numpy as np
from test_ps_equivalence import OPT  # noqa: E402

from cmdare.control.balancers import ScriptedSource, decisions_for_request
from cmdare.ps.psld.decisions import Move
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.checkpoint import latest_checkpoint, load_checkpoint


class _Events(TrainCallback):
    def __init__(self):
        self.events = []

    def on_event(self, r):
        self.events.append(r)


def _spec(**kw):
    base = dict(model="resnet8", dataset="digits", workers=2, ps=2, steps=30, batch_size=16, sync=True,
                optimizer=OPT, checkpoint_every=30, eval_every=0, seed=3, chunk_steps=5)
    base.update(kw)
    return TrainSpec(**base)


def _params(path) -> np.ndarray:
    return load_checkpoint(latest_checkpoint(path)).params


def test_sync_run_with_moves_and_shard_changes_equals_run_without(local_ray, tmp_path):
    plain = Trainer(_spec(), checkpoint_dir=tmp_path / "plain").run()
    # every few steps: move blocks both ways, add a shard and fill it, move again, drain and remove one
    script = {
        5: lambda p: [Move(b.block_id, 0, 1) for b in p.blocks_on(0)[:3]] + [Move(p.blocks_on(1)[0].block_id, 1, 0)],
        10: lambda p: decisions_for_request({"action": "add"}, p),
        15: lambda p: [Move(b.block_id, 2, 0) for b in p.blocks_on(2)[:2]],
        20: lambda p: decisions_for_request({"action": "remove", "shard": 1}, p),
    }
    log = _Events()
    moved = Trainer(_spec(), [log], checkpoint_dir=tmp_path / "moved", decisions=ScriptedSource(script)).run()
    assert plain.global_step == moved.global_step == 30
    kinds = [e.kind for e in log.events]
    assert kinds.count("ps_move") == 2 and kinds.count("ps_add") == 1 and kinds.count("ps_remove") == 1
    changes = [e for e in log.events if e.kind.startswith("ps_")]
    assert all(e.details["pause_s"] > 0 and not e.details["rolled_back"] for e in changes)
    np.testing.assert_array_equal(_params(tmp_path / "moved"), _params(tmp_path / "plain"))


class _DyingDestination(Trainer):
    """A trainer whose added shards die as they start (the destination of a migration fails)."""

    def _setup(self, *args):
        import ray

        super()._setup(*args)
        start = self.shard_group.new_shard

        def dying(k, server=None):
            actor = start(k, server)
            if self.global_step > 0:
                ray.get(actor.ping.remote())
                ray.kill(actor)
            return actor

        self.shard_group.new_shard = dying


def test_failed_migration_rolls_back_and_training_continues(local_ray, tmp_path):
    plain = tmp_path / "plain"
    Trainer(_spec(steps=20, checkpoint_every=20), checkpoint_dir=plain).run()
    log = _Events()
    script = {5: lambda p: decisions_for_request({"action": "add"}, p)}
    summary = _DyingDestination(_spec(steps=20, checkpoint_every=20), [log], checkpoint_dir=tmp_path / "rb",
                                decisions=ScriptedSource(script)).run()
    assert summary.status == "finished" and summary.global_step == 20
    change = [e for e in log.events if e.kind.startswith("ps_")]
    assert len(change) == 1 and change[0].details["rolled_back"] and change[0].details["num_shards"] == 2
    np.testing.assert_array_equal(_params(tmp_path / "rb"), _params(plain))
