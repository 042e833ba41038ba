"""Batch-norm statistics are the model's, not the chief's: a chief that joined a few steps before the end gives
the accuracy of one that trained throughout, and the exported file scores what the run reported."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cmdare.ps.optimizer import OptimizerConfig
from cmdare.tasks import build_task
from cmdare.tasks.statistics import batch_norm_layers
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.checkpoint import load_checkpoint
from cmdare.train.duties.export import checkpoint_state_dict

STEPS = 200


class _Events(TrainCallback):
    def __init__(self):
        self.events = []

    def on_event(self, r):
        self.events.append(r)


def _spec(revocations: str) -> TrainSpec:
    # Synchronous rounds of both workers, so that both runs are deterministic and their accuracies differ by what
    # the revocations changed, not by the order asynchronous pushes happened to arrive in (asynchronously the two
    # differed by 0.004 to 0.014 from run to run of the same code). step=1: cloud time is the global step.
    # "184@1+194@0": slot 1 revoked at step 184 (its replacement joins at once), then the chief (slot 0) at step
    # 194: the newcomer, 10 rounds old, is the chief at the end.
    return TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=STEPS, batch_size=32,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=STEPS, eval_every=0, seed=3,
                     transient=True, revocations=revocations, replace="same", startup="0", chunk_steps=5, sync=True)


def _exported_accuracy(storage_dir, spec: TrainSpec) -> float:
    ckpt = load_checkpoint(storage_dir)
    task = spec.task()  # the run's own test split (drawn from its seed)
    model = task.build()
    model.load_state_dict(checkpoint_state_dict(ckpt, spec))
    model.eval()
    return task.evaluate(model, "cpu").accuracy


def test_a_chief_that_joined_just_before_the_end_evaluates_and_exports_the_trained_model(local_ray, tmp_path):
    quiet = Trainer(_spec("none"), checkpoint_dir=tmp_path / "quiet").run()
    log = _Events()
    late = Trainer(_spec("trace=184@1+194@0,step=1"), [log], checkpoint_dir=tmp_path / "late").run()
    assert quiet.status == late.status == "finished"
    changes = [e for e in log.events if e.kind == "chief_change"]
    joined = {e.worker_id: e.global_step for e in log.events if e.kind == "replacement_joined"}
    last_chief = changes[-1].details["to"]
    assert last_chief in joined and STEPS - joined[last_chief] <= 20, (changes, joined)  # the scenario happened
    assert quiet.final_accuracy > 0.8
    assert abs(late.final_accuracy - quiet.final_accuracy) <= 0.01, (late.final_accuracy, quiet.final_accuracy)
    # the exported model scores what the run reported: the same parameters and statistics of the last step
    assert _exported_accuracy(tmp_path / "late", _spec("none")) == pytest.approx(late.final_accuracy, abs=1e-6)


def test_recomputed_statistics_are_the_parameters_own_and_leave_the_random_stream_alone():
    torch.manual_seed(0)
    task = build_task("resnet8", "digits")
    model = task.build()
    for layer in batch_norm_layers(model):  # statistics of some other history
        layer.running_mean.fill_(5.0)
        layer.running_var.fill_(9.0)
    state = torch.random.get_rng_state()
    assert task.recompute_statistics(model, "cpu", 32, seed=3, samples=256) == len(batch_norm_layers(model)) > 0
    assert torch.equal(torch.random.get_rng_state(), state)
    first = {k: v.clone() for k, v in model.named_buffers()}
    assert model.training
    # the first layer's mean is the mean of its inputs' batch means over the 8 calibration batches, exactly
    bn = batch_norm_layers(model)[0]
    seen = []
    hook = bn.register_forward_hook(lambda m, inp, out: seen.append(inp[0].mean(dim=(0, 2, 3))))
    task.recompute_statistics(model, "cpu", 32, seed=3, samples=256)
    hook.remove()
    assert len(seen) == 8
    np.testing.assert_allclose(bn.running_mean.numpy(), torch.stack(seen).mean(0).numpy(), rtol=1e-5, atol=1e-6)
    assert all(torch.equal(first[k], v) for k, v in model.named_buffers())  # a function of the parameters alone
    assert bn.momentum == 0.1  # the layers' own momentum is back
