"""Batch-norm statistics of the parameters a run evaluates, checkpoints and exports, recomputed ("precise BN").

A worker's running statistics describe the batches *it* saw, averaged with momentum over its own history. A
newcomer that has trained 9 steps holds statistics that are 61% its own few batches and 39% a fresh layer's
(mean 0, variance 1); and which worker is chief changes with every revocation. Evaluated or exported with those
statistics, a well-trained model scored 0.16 where it had scored 0.99 a hundred steps before.

So the chief recomputes them for the very parameters of the step before each evaluation and checkpoint: every
batch-norm layer is reset, and a fixed set of training batches (:func:`calibration_stream`: the same on every
worker, drawn from the run's seed) runs forward in training mode with a cumulative average (``momentum=None``).
The statistics are then a function of the parameters alone: the evaluation, the checkpoint and its export of one
step agree, whichever worker was chief and however long it had trained. Training itself normalises with each
batch's own statistics and is not affected. Other buffers a model registers are the chief's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["CALIBRATION_SAMPLES", "CALIBRATION_SEED", "batch_norm_layers", "calibration_batches",
           "recompute_batch_norm"]

#: Training samples run forward to recompute the statistics (the default of ``TrainSpec.bn_samples``). Wu and
#: Johnson ("Rethinking 'Batch' in BatchNorm", 2021) find population statistics settle after a few thousand
#: samples on ImageNet; the small datasets here settle sooner (tests/train/test_batch_norm_statistics.py).
CALIBRATION_SAMPLES = 512

#: Added to the run's seed for the calibration batches' order, so they are not the first batches of data slot 0.
CALIBRATION_SEED = 0x5EED


def batch_norm_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's batch-norm layers that keep running statistics."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


def calibration_batches(num_samples: int, batch_size: int, samples: int) -> int:
    """How many batches of ``batch_size`` make ``samples`` training samples: at most one pass over the
    ``num_samples`` of the training data, at least one batch."""
    return max(1, min(samples, num_samples) // batch_size)


def recompute_batch_norm(model: torch.nn.Module, batches: Iterator[tuple[Any, Any]], count: int, device: Any,
                         seed: int) -> int:
    """Reset ``model``'s batch-norm statistics and recompute them from ``count`` batches of ``batches`` (inputs
    run forward in training mode, a cumulative average over the batches). Random layers (dropout) draw from a
    stream seeded by ``seed`` and the caller's random state is left as it was, so the result is a function of
    the parameters and the batches. Returns the number of layers recomputed (0: the model has none; nothing ran).
    """
    import torch

    layers = batch_norm_layers(model)
    if not layers or count <= 0:
        return 0
    momenta = [m.momentum for m in layers]
    training = model.training
    devices = [device] if getattr(device, "type", str(device)) == "cuda" else []
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None  # a cumulative moving average: every batch weighs the same
        model.train()
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed + CALIBRATION_SEED)
            for _ in range(count):
                x, _y = next(batches)
                model(x.to(device, non_blocking=True) if hasattr(x, "to") else x)
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        model.train(training)
    return len(layers)
