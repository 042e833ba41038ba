"""Shard load monitoring on the real engine: queueing delay, worker-observed wait, per-block loads,
the emulated PS link, and their records in the store."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.store import open_store
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.checkpoint import latest_checkpoint, load_checkpoint
from cmdare.train.spec import parse_rate_bytes_per_s


class _Shards(TrainCallback):
    def __init__(self):
        self.shards = []

    def on_shard(self, r):
        self.shards.append(r)


def _spec(**kw) -> TrainSpec:
    base = dict(model="resnet8", dataset="digits", workers=2, ps=2, steps=60, batch_size=16,
                optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, seed=2, chunk_steps=5)
    base.update(kw)
    return TrainSpec(**base)


@pytest.mark.cluster  # make test-cluster: a run over a slow emulated link
def test_slow_link_shard_shows_in_busy_queue_and_wait_and_blocks_are_recorded(local_ray, tmp_path):
    got = _Shards()
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    spec = _spec(ps_bandwidth="20MB/s", straggler="0:3")
    summary = Trainer(spec, [got, StoreRecorder(store)], checkpoint_dir=tmp_path / "ck").run()
    assert summary.status == "finished"
    per = {k: [r for r in got.shards if r.shard_id == k] for k in (0, 1)}
    tot = {k: {f: sum(getattr(r, f) for r in rs) for f in ("pushes", "bytes_in", "bytes_out", "busy_s", "apply_s",
                                                          "queue_s", "wait_s")} for k, rs in per.items()}
    bw = parse_rate_bytes_per_s("20MB/s")
    for k, factor in ((0, 3.0), (1, 1.0)):
        t = tot[k]
        assert t["pushes"] >= 60
        link = t["busy_s"] - t["apply_s"]  # the emulated link's share of the serving time
        assert link >= (t["bytes_in"] + t["bytes_out"]) / bw * factor * 0.99
        assert link <= (t["bytes_in"] + t["bytes_out"] + 2 * t["bytes_out"] / t["pushes"]) / bw * factor * 1.01
        assert t["queue_s"] > 0 and t["wait_s"] > 0
    # workers waited longer on the slow shard, and at least its serving time per push
    assert tot[0]["wait_s"] > tot[1]["wait_s"]
    assert tot[0]["wait_s"] / tot[0]["pushes"] >= 0.9 * tot[0]["busy_s"] / tot[0]["pushes"]
    # per block: bytes add up to the shard's, waits are the shard's
    for r in got.shards:
        if r.pushes:
            assert sum(b.bytes_in for b in r.blocks) == r.bytes_in
            assert all(b.wait_s == r.wait_s and b.shard_id == r.shard_id for b in r.blocks)
    with store.engine.connect() as conn:
        n_blocks = conn.execute(text("select count(*) from block_metrics where run_id = :r"),
                                {"r": summary.run_id}).scalar()
        waits = conn.execute(text("select shard_id, sum(wait_s), sum(queue_s) from shard_metrics "
                                  "where run_id = :r group by shard_id order by shard_id"),
                             {"r": summary.run_id}).all()
    assert n_blocks == sum(len(r.blocks) for r in got.shards) > 0
    assert [round(w, 6) for _, w, _ in waits] == [round(tot[k]["wait_s"], 6) for k in (0, 1)]


def test_sync_training_over_an_emulated_link_gives_the_same_parameters(local_ray, tmp_path):
    runs = {}
    for name, bw in (("plain", None), ("link", "50MB/s")):
        spec = _spec(sync=True, steps=20, checkpoint_every=20, ps_bandwidth=bw)
        assert Trainer(spec, checkpoint_dir=tmp_path / name).run().global_step == 20
        runs[name] = load_checkpoint(latest_checkpoint(tmp_path / name)).params
    np.testing.assert_array_equal(runs["link"], runs["plain"])


def test_link_rates_read_in_bytes_and_bits():
    forms = {"200MB/s": 2e8, "1.6Gbit/s": 2e8, "10Gbps": 1.25e9, "5e8": 5e8, "1GiB/s": 2.0**30, "100 Mbit/s": 1.25e7,
             "3k": 3e3, "2Mbits/s": 2.5e5}
    assert {t: parse_rate_bytes_per_s(t) for t in forms} == forms
