"""Local emulation is honest about disks: each worker node of a local multi-node cluster has a private
scratch directory that goes with the node; checkpoints live in the run's storage and survive the chief's
node being removed."""

from __future__ import annotations

import dataclasses

import pytest

from cmdare.cloud.local import LocalClusterProvider, LocalProcessProvider
from cmdare.cloud.servers import ServerSpec
from cmdare.errors import TransientError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.checkpoint import CheckpointStore

pytestmark = pytest.mark.cluster  # make test-cluster: multi-node clusters with a disk per node


def test_a_node_writes_to_its_own_disk_and_loses_it_with_the_node(cluster, tmp_path):
    import ray

    provider = LocalClusterProvider(cluster, scratch_root=tmp_path / "nodes")
    server = provider.request(ServerSpec("K80", "gcp", "us-east1", True, 0.1))
    provider.prepare(server)

    @ray.remote(num_cpus=0)
    def write_locally() -> tuple[str, str]:
        from cmdare.paths import checkpoint_root, scratch_dir

        (scratch_dir() / "marker").write_text("on this server only")
        return str(scratch_dir()), str(checkpoint_root())

    scratch, ckpt_root = ray.get(write_locally.options(**provider.actor_options(server)).remote())
    assert scratch == str(server.scratch_dir) and ckpt_root.startswith(scratch)  # not the driver's data directory
    assert (server.scratch_dir / "marker").read_text() == "on this server only"
    provider.revoke(server)
    assert not server.scratch_dir.exists()  # a revoked VM's disk is gone, and what was written there with it


class _RevokeChiefAfterFirstCheckpoint(TrainCallback):
    def __init__(self):
        self.trainer, self.node_disk, self.step = None, None, None

    def on_checkpoint(self, report):
        if self.step is None:
            self.step = report.global_step
            server = self.trainer.workers[report.worker_id].server
            self.node_disk = server.scratch_dir
            self.trainer.provider.revoke(server)


def test_a_run_whose_chief_node_was_removed_resumes_from_storage(cluster, tmp_path):
    storage = tmp_path / "storage"
    # the chief's node goes at the first checkpoint (step 10); the run cannot reach its last step before Ray
    # reports the node dead (40 steps could, once the data path got fast), and the resume finishes a short run
    spec = TrainSpec(model="resnet8", workers=1, steps=100_000, checkpoint_every=10, eval_every=0, batch_size=16,
                     chunk_steps=5, storage=str(storage), transient=True, revocations="none", replace="none",
                     startup="0", seed=2)
    revoke = _RevokeChiefAfterFirstCheckpoint()
    trainer = Trainer(spec, [revoke], run_id="run-disk", provider=LocalClusterProvider(cluster,
                                                                                      scratch_root=tmp_path / "nodes"))
    revoke.trainer = trainer
    with pytest.raises(TransientError, match="every worker was lost"):
        trainer.run()
    assert revoke.step is not None and not revoke.node_disk.exists()  # the chief's node and its disk are gone
    stored = CheckpointStore(trainer.storage).load().step
    assert stored >= revoke.step  # ... the checkpoints are not
    rest = dataclasses.replace(spec, steps=stored + 30)
    summary = Trainer(rest, run_id="run-disk", resume=True, provider=LocalProcessProvider()).run()
    assert summary.status == "finished" and summary.global_step == stored + 30
