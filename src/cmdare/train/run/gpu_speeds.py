"""How fast a run's model trains on each GPU type, by the step-time model: the speeds that price a
replacement (``cheapest``: :class:`~cmdare.control.offers.ReplacementOffers`) and the compute stretch that
emulates a mixed cluster on one machine.

Locally every worker computes on this machine's CPU, so a run of ``k80:2,v100:1`` emulates the types: each
worker's steps are stretched to the step-time model's ratio between its type and the fastest type present
(that one trains at this machine's speed; a stretch is never below 1). The model's features are those of
the network its name names (:func:`cmdare.predict.workloads.workload_features`): the measured ones for the
networks CM-DARE measured, else the profiled model's, whose training FLOPs per sample follow the tables'
convention (within 2% on the measured networks). Before, the profiled count was multiplied by 4, a ratio
taken from He's ResNet-32 against T2T's, and ``resnet15``/``resnet32`` took T2T's measured features.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from cmdare.errors import CmdareError

if TYPE_CHECKING:
    from cmdare.train.runtime.emitter import RunEmitter
    from cmdare.train.spec import TrainSpec

__all__ = ["compute_stretch", "emulated_step_stretch", "step_time_s", "steps_per_s"]


@functools.cache
def step_time_s(model: str, gpu: str, batch_size: int | None = None) -> float | None:
    """Predicted seconds per step of ``model`` on ``gpu`` at a per-worker ``batch_size`` (None: train's default;
    None returned: the model cannot say for this GPU)."""
    from cmdare.predict import predict_step_time_s

    try:
        t = predict_step_time_s(model, gpu, batch_size=batch_size)  # the network the name names
    except CmdareError:
        return None
    return t if t > 0 else None


def compute_stretch(model: str, gpus: Iterable[str], batch_size: int | None = None) -> dict[str, float]:
    """GPU type -> the factor its workers' steps are stretched by (1 for the fastest type present; 1 for
    every type when the model cannot rank them), at a per-worker ``batch_size`` (None: train's default)."""
    types = list(dict.fromkeys(g.lower() for g in gpus))
    times = {g: step_time_s(model, g, batch_size) for g in types}
    known = [t for t in times.values() if t is not None]
    if len(types) < 2 or not known:
        return dict.fromkeys(types, 1.0)
    fastest = min(known)
    return {g: max(1.0, t / fastest) if t is not None else 1.0 for g, t in times.items()}


def emulated_step_stretch(spec: TrainSpec, emitter: RunEmitter) -> dict[str, float]:
    """The stretch of each GPU type of ``spec``'s mix, reported as an ``emulated_gpu_speeds`` event (so the
    store says the types' speeds were emulated, and by which factors)."""
    stretch = compute_stretch(spec.model_name, spec.slot_gpus(), spec.batch_size)
    emitter.event("emulated_gpu_speeds", details={"step_stretch": stretch, "source": "step-time model"})
    return stretch


def steps_per_s(model: str, batch_size: int | None = None) -> Callable[[str], float | None]:
    """Steps per second a worker trains ``model`` at (per-worker ``batch_size``; None: train's default), by GPU
    type (None: the step-time model cannot say)."""

    def speed(gpu: str) -> float | None:
        t = step_time_s(model, gpu.lower(), batch_size)
        return 1.0 / t if t else None

    return speed
