"""``--precision`` (issue 45 item 4): ``amp-bf16`` and ``amp-fp16`` run a worker's forward pass and loss under
``torch.autocast`` (parameters, gradients and the shards in float32); float16 with dynamic loss scaling; unknown names
are refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from cmdare.errors import UnknownNameError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.workers.precision import LossScale, forward_precision, loss_scale_for


def test_bf16_autocasts_the_forward_pass_and_fp32_leaves_it_alone():
    conv = torch.nn.Conv2d(1, 4, 3)
    x = torch.randn(2, 1, 8, 8)
    with forward_precision("amp-bf16", torch.device("cpu"))():
        assert conv(x).dtype == torch.bfloat16
    with forward_precision("fp32", torch.device("cpu"))():
        assert conv(x).dtype == torch.float32
    assert conv.weight.dtype == torch.float32  # the parameters stay float32


def test_fp16_autocasts_and_unknown_precisions_are_refused_in_one_line():
    conv = torch.nn.Conv2d(1, 4, 3)
    with forward_precision("amp-fp16", torch.device("cpu"))():
        assert conv(torch.randn(2, 1, 8, 8)).dtype == torch.float16
    with pytest.raises(UnknownNameError, match="amp-bf16"):
        TrainSpec(precision="bf16")
    assert TrainSpec(precision="amp-bf16").precision == "amp-bf16"
    assert TrainSpec(precision="amp-fp16").precision == "amp-fp16"
    assert loss_scale_for("amp-fp16") is not None and loss_scale_for("amp-bf16") is None


def test_loss_scale_skips_an_overflow_halves_and_grows_back():
    import numpy as np

    scale = LossScale(scale=8.0, growth_interval=2, min_scale=1.0)
    grads = np.array([16.0, -8.0], dtype=np.float32)
    assert scale.unscale(grads) and grads.tolist() == [2.0, -1.0]  # divided in place
    bad = np.array([np.inf, 1.0], dtype=np.float32)
    assert not scale.unscale(bad) and scale.scale == 4.0 and scale.skipped == 1 and not scale.exhausted
    assert bad[1] == 1.0  # a skipped gradient is left as it was
    for _ in range(2):
        assert scale.unscale(np.ones(2, dtype=np.float32))
    assert scale.scale == 8.0  # two finite steps in a row: doubled
    low = LossScale(scale=1.0, min_scale=1.0)
    assert not low.unscale(np.array([np.nan], dtype=np.float32)) and low.exhausted


def test_an_fp16_run_with_loss_scaling_trains(local_ray, tmp_path):
    """One synchronous worker in float16 with dynamic loss scaling learns."""
    spec = TrainSpec(model="resnet8", dataset="digits", workers=1, ps=1, steps=60, sync=True, precision="amp-fp16",
                     checkpoint_every=0, eval_every=0, seed=3, chunk_steps=5)
    cb = _Losses()
    summary = Trainer(spec, [cb], checkpoint_dir=tmp_path / "fp16").run()
    assert summary.status == "finished" and summary.global_step == 60
    assert all(math.isfinite(v) for v in cb.losses)
    assert sum(cb.losses[-3:]) / 3 < 0.8 * cb.losses[0]
    assert not [e for e in cb.events if e.kind == "loss_scale_overflow"]  # 2^16 suits this model: no overflow


def test_an_fp16_worker_skips_overflowing_gradients_halves_the_scale_and_trains_on(local_ray, tmp_path):
    """A worker starting at a loss scale of 2^40 overflows float16 in its backward pass: it pushes nothing for those
    batches, halves the scale each time, reports the overflows, and then trains (the run ends finished, learning)."""
    import sys

    from cmdare.train.workers.worker import Worker

    class HugeScale(Worker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_scale = LossScale(scale=2.0**40)

    patched = [name for name, mod in list(sys.modules.items())
               if name.startswith("cmdare.") and name != Worker.__module__ and getattr(mod, "Worker", None) is Worker]
    spec = TrainSpec(model="resnet8", dataset="digits", workers=1, ps=1, steps=60, sync=True, precision="amp-fp16",
                     checkpoint_every=0, eval_every=0, seed=3, chunk_steps=5)
    cb = _Losses()
    with pytest.MonkeyPatch.context() as mp:
        assert patched
        for name in patched:
            mp.setattr(sys.modules[name], "Worker", HugeScale)
        summary = Trainer(spec, [cb], checkpoint_dir=tmp_path / "huge").run()
    assert summary.status == "finished" and summary.global_step == 60
    overflows = [e.details for e in cb.events if e.kind == "loss_scale_overflow"]
    skipped = sum(d["skipped"] for d in overflows)
    assert skipped >= 10  # 2^40 down to float16's range, one halving per skipped batch
    assert min(d["loss_scale"] for d in overflows) == pytest.approx(2.0 ** (40 - skipped))
    assert all(math.isfinite(v) for v in cb.losses) and sum(cb.losses[-3:]) / 3 < 0.8 * cb.losses[0]


class _Losses(TrainCallback):
    def __init__(self):
        self.losses: list[float] = []
        self.events: list = []

    def on_step(self, r):
        self.losses.append(r.loss)

    def on_event(self, r):
        self.events.append(r)


def test_a_bf16_run_trains_and_its_arithmetic_differs_from_float32(local_ray, tmp_path):
    """One synchronous worker, the same seed and data: float32 and bfloat16 start from the same loss to bfloat16's
    precision, both learn, and their losses are not the same numbers (the forward pass ran in bfloat16)."""
    losses = {}
    for precision in ("fp32", "amp-bf16"):
        spec = TrainSpec(model="resnet8", dataset="digits", workers=1, ps=1, steps=60, sync=True, precision=precision,
                         checkpoint_every=0, eval_every=0, seed=3, chunk_steps=5)
        cb = _Losses()
        summary = Trainer(spec, [cb], checkpoint_dir=tmp_path / precision).run()
        assert summary.status == "finished" and summary.global_step == 60
        assert all(math.isfinite(v) for v in cb.losses)
        losses[precision] = cb.losses
    fp32, bf16 = losses["fp32"], losses["amp-bf16"]
    assert bf16[0] == pytest.approx(fp32[0], rel=0.05)  # the first chunk: the same model and batches
    assert bf16 != fp32
    for run in (fp32, bf16):
        assert sum(run[-3:]) / 3 < 0.8 * run[0]  # it learns


def test_a_local_simulation_says_its_steps_are_float32_and_a_joined_one_predicts_the_precision():
    from cmdare.run_simulation import unsimulated_options

    named = " ".join(unsimulated_options(TrainSpec(precision="amp-fp16"), joined=False))
    assert "--precision (a local run's emulated step times are float32 predictions)" in named
    assert "--precision" not in " ".join(unsimulated_options(TrainSpec(), joined=False))
    assert "--precision" not in " ".join(unsimulated_options(TrainSpec(precision="amp-fp16"), joined=True))
