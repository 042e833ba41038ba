"""Asynchronous training learns; measurements reach the callbacks and the store."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.store import open_store
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _Collect(TrainCallback):
    def __init__(self):
        self.steps, self.shards, self.evals, self.ckpts = [], [], [], []

    def on_step(self, r):
        self.steps.append(r)

    def on_shard(self, r):
        self.shards.append(r)

    def on_eval(self, r):
        self.evals.append(r)

    def on_checkpoint(self, r):
        self.ckpts.append(r)


def test_async_two_workers_reach_90_percent_on_digits(local_ray, tmp_path):
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=2, steps=300, batch_size=32,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=100, eval_every=100, seed=1)
    got = _Collect()
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    summary = Trainer(spec, [got, StoreRecorder(store)], checkpoint_dir=tmp_path / "ck").run()
    assert summary.status == "finished" and summary.global_step == 300
    assert summary.final_accuracy >= 0.90, summary.final_accuracy
    # both workers pushed; every applied push is reported once: by each report, the pushes reported so far
    # are distinct applied steps (so at most the reported global step), and at the end they are all the
    # steps but at most one last push per worker (applied on one shard, refused by the other, so not
    # counted as a step); shard load was counted
    assert {r.worker_id for r in got.steps} == {0, 1}
    reported = np.cumsum([r.steps for r in got.steps])
    assert all(n <= r.global_step for n, r in zip(reported, got.steps, strict=True)), list(reported)
    assert 300 - spec.workers <= reported[-1] <= 300
    assert sum(r.pushes for r in got.shards) == 2 * 300  # every step pushes to both shards
    assert all(r.bytes_in > 0 for r in got.shards if r.pushes)
    assert [c.global_step for c in got.ckpts][-1] == 300 and all(c.size_bytes > 0 for c in got.ckpts)
    assert got.evals[-1].accuracy == summary.final_accuracy
    # staleness: one value per reported push; with two asynchronous workers some pushes are stale
    assert all(len(r.staleness) == r.steps for r in got.steps)
    assert max(s for r in got.steps for s in r.staleness) >= 1
    with store.engine.connect() as conn:
        n_steps = conn.execute(text("select count(*) from step_metrics where run_id = :r"),
                               {"r": summary.run_id}).scalar()
        status = conn.execute(text("select status from runs where run_id = :r"), {"r": summary.run_id}).scalar()
    assert n_steps == len(got.steps) and status == "finished"
