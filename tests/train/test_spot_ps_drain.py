"""Ray's preemption drain of a parameter server's node is a notice: the shard's blocks leave before the deadline."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from test_drain_notice import _DRAIN

from cmdare.cloud.detection import LOCAL_FAILURE_DETECTION
from cmdare.cloud.local import LocalClusterProvider
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.checkpoint import latest_checkpoint, load_checkpoint
from cmdare.train.run.ray_session import start_local_cluster

pytestmark = pytest.mark.cluster  # make test-cluster: a multi-node cluster whose PS node is drained

DEADLINE_S = 60


@pytest.fixture(scope="module")
def ps_cluster():
    """A head without ``cmdare_ps`` and two PS nodes: a drained PS node leaves the other for the replacement."""
    import ray

    c = start_local_cluster(num_cpus=3, _system_config=LOCAL_FAILURE_DETECTION)
    for _ in range(2):
        c.add_node(num_cpus=2, resources={"cmdare_ps": 100}, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


class _DrainShardNode(TrainCallback):
    def __init__(self, at_step: int):
        self.at_step, self.trainer, self.events, self.drained = at_step, None, [], None

    def on_step(self, r):
        if self.drained is None and r.global_step >= self.at_step:
            import ray

            node = ray.get(self.trainer.shards[0].node_id.remote())
            self.drained = {"node_id": node, "at": time.time()}
            address = self.trainer.provider.cluster.gcs_address
            self.drained["proc"] = subprocess.run([sys.executable, "-c", _DRAIN, address, node, str(DEADLINE_S)],
                                                  capture_output=True, text=True, timeout=60)

    def on_event(self, r):
        self.events.append(r)


def test_a_drained_ps_node_hands_its_blocks_to_a_replacement_before_the_deadline(ps_cluster, tmp_path):
    base = dict(model="resnet8", workers=2, ps=1, steps=400, sync=True, checkpoint_every=400, eval_every=0,
                transient=False, revocations="none", startup="0", chunk_steps=5, batch_size=16)
    plain = Trainer(TrainSpec(**base), checkpoint_dir=tmp_path / "plain",
                    provider=LocalClusterProvider(ps_cluster)).run()
    hook = _DrainShardNode(at_step=40)
    trainer = Trainer(TrainSpec(**base, ps_transient=True), [hook], checkpoint_dir=tmp_path / "spot",
                      provider=LocalClusterProvider(ps_cluster))
    hook.trainer = trainer
    summary = trainer.run()
    assert hook.drained["proc"].returncode == 0, hook.drained["proc"].stderr
    assert summary.status == "finished" and summary.global_step == plain.global_step == 400
    kinds = [e.kind for e in hook.events]
    (notice,) = [e for e in hook.events if e.kind == "ps_notice"]
    assert notice.details["source"] == "ray" and notice.details["onto"] == "replacement"
    (evac,) = [e for e in hook.events if e.kind == "shard_evacuated"]
    assert evac.time < hook.drained["at"] + DEADLINE_S and evac.details["margin_s"] > 0
    assert "shard_restored" not in kinds
    np.testing.assert_array_equal(load_checkpoint(latest_checkpoint(tmp_path / "spot")).params,
                                  load_checkpoint(latest_checkpoint(tmp_path / "plain")).params)
