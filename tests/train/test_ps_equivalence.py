"""Synchronous PS training equals single-process SGD; resume continues exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cmdare.datasets import BatchStream, load_dataset
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import RunInfo, TrainCallback
from cmdare.train.checkpoint import latest_checkpoint, load_checkpoint
from cmdare.workloads import build_model

OPT = OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=5e-4)


def _spec(ps: int, steps: int, **kw) -> TrainSpec:
    base = dict(model="resnet8", dataset="digits", workers=1, ps=ps, steps=steps, batch_size=16, sync=True,
                optimizer=OPT, checkpoint_every=steps, eval_every=0, seed=3, chunk_steps=50)
    base.update(kw)
    return TrainSpec(**base)


def _reference(steps: int, seed: int = 3) -> np.ndarray:
    """Plain single-process PyTorch SGD; one thread, like a worker with one CPU (thread counts change
    the reduction order in convolutions, and 20 steps amplify that rounding to ~1e-3)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_loop(steps, seed)
    finally:
        torch.set_num_threads(threads)


def _reference_loop(steps: int, seed: int) -> np.ndarray:
    data = load_dataset("digits", seed=seed)
    torch.manual_seed(seed)
    model = build_model("resnet8", num_classes=data.num_classes, in_channels=data.input_shape[0])
    opt = torch.optim.SGD(model.parameters(), lr=OPT.lr, momentum=OPT.momentum, weight_decay=OPT.weight_decay)
    stream = BatchStream(data, 0, 1, 16, seed)
    model.train()
    for _ in range(steps):
        x, y = next(stream)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def _final_params(tmp_path) -> np.ndarray:
    return load_checkpoint(latest_checkpoint(tmp_path)).params


@pytest.mark.parametrize("ps", [1, 2, 3])
def test_sync_ps_matches_single_process_sgd(local_ray, tmp_path, ps):
    summary = Trainer(_spec(ps, 20), checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == 20
    np.testing.assert_allclose(_final_params(tmp_path), _reference(20), rtol=1e-4, atol=1e-5)


class _Starts(TrainCallback):
    def __init__(self):
        self.infos: list[RunInfo] = []

    def on_run_start(self, info):
        self.infos.append(info)


def test_resume_continues_from_checkpoint_exactly(local_ray, tmp_path):
    straight = tmp_path / "straight"
    Trainer(_spec(2, 24), checkpoint_dir=straight).run()
    split = tmp_path / "split"
    Trainer(_spec(2, 12), checkpoint_dir=split, run_id="run-split").run()
    starts = _Starts()
    summary = Trainer(_spec(2, 24, checkpoint_every=12), [starts], checkpoint_dir=split, run_id="run-split",
                      resume=True).run()
    assert starts.infos[0].resumed_from_step == 12 and summary.global_step == 24
    np.testing.assert_allclose(_final_params(split), _final_params(straight), rtol=1e-5, atol=1e-6)
