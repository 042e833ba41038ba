"""GPUs by default (``--gpus-per-worker auto``): one GPU per worker when the cluster has GPUs, shared evenly on
this machine's own Ray when it has fewer GPUs than workers (none on a cluster without GPUs: every other
training test). The GPUs here are
declared to Ray (``num_gpus``), not real: Ray assigns them, the workers train on the CPU."""

from __future__ import annotations

import pytest

from cmdare.errors import UserInputError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.run.run_start import gpus_per_worker


@pytest.fixture(scope="module")
def ray_with_gpus():
    from cmdare.train.run.ray_session import start_local_ray

    ray = start_local_ray(num_cpus=4, num_gpus=1)
    yield ray
    ray.shutdown()


class _Devices(TrainCallback):
    def __init__(self):
        self.trainer, self.seen = None, {}

    def on_step(self, r):
        import ray

        if not self.seen:
            self.seen = {w.worker_id: ray.get(w.actor.device_info.remote()) for w in self.trainer.workers.values()}


@pytest.mark.parametrize("given, expected", [("auto", 0.5), (0.0, 0.0), (1.0, 1.0)])
def test_workers_take_the_gpus_the_cluster_has(ray_with_gpus, tmp_path, given, expected):
    spec = TrainSpec(model="resnet8", workers=2, steps=30, checkpoint_every=0, eval_every=0, transient=False,
                     gpus_per_worker=given)
    assert gpus_per_worker(spec, joined=False) == expected
    if given == 1.0:  # two workers asking a whole GPU each of a 1-GPU machine: one would wait forever
        return
    hook = _Devices()
    trainer = Trainer(spec, [hook], checkpoint_dir=tmp_path)
    hook.trainer = trainer
    assert trainer.run().status == "finished"
    assert len(hook.seen) == 2
    for info in hook.seen.values():
        assert bool(info["gpu_ids"]) == (expected > 0), info  # Ray assigned (a share of) the GPU
        assert info["device"] == "cpu"  # declared, not real: no CUDA here


def test_auto_on_a_joined_cluster_is_one_gpu_each(ray_with_gpus):
    spec = TrainSpec(workers=4)
    assert spec.gpus_per_worker == "auto"
    assert gpus_per_worker(spec, joined=True) == 1.0  # its autoscaler adds GPU nodes for the rest
    with pytest.raises(UserInputError, match="gpus-per-worker"):
        TrainSpec(gpus_per_worker="many")
