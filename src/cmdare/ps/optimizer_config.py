"""SGD's hyper-parameters and learning-rate schedule (no torch: :mod:`cmdare.ps.optimizer` applies them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cmdare.errors import UnknownNameError, UserInputError

__all__ = ["SCHEDULES", "OptimizerConfig", "async_momentum"]

SCHEDULES = ("constant", "step", "cosine")
@dataclass(frozen=True)
class OptimizerConfig:
    """SGD hyper-parameters and the learning-rate schedule (a function of the global step)."""

    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    schedule: str = "constant"  # constant | step | cosine
    warmup_steps: int = 0
    decay_steps: tuple[int, ...] = ()  # for "step": steps at which lr *= decay_factor
    decay_factor: float = 0.1
    total_steps: int = 0  # for "cosine"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise UnknownNameError("learning-rate schedule", self.schedule, SCHEDULES)
        for name in ("lr", "momentum", "weight_decay", "decay_factor"):
            if not math.isfinite(getattr(self, name)):
                raise UserInputError(f"--{name.replace('_', '-')} must be a finite number, got {getattr(self, name)}")
        if self.lr <= 0 or self.momentum < 0 or self.weight_decay < 0:
            raise UserInputError("lr must be positive; momentum and weight decay non-negative")
        if self.nesterov and self.momentum == 0:
            raise UserInputError("nesterov momentum needs momentum > 0")

    def lr_at(self, step: int, lr_scale: float = 1.0) -> float:
        """Learning rate for the update applied at global ``step`` (0-based)."""
        lr = self.lr * lr_scale
        if self.warmup_steps and step < self.warmup_steps:
            return lr * (step + 1) / self.warmup_steps
        if self.schedule == "step":
            lr *= self.decay_factor ** sum(step >= s for s in self.decay_steps)
        elif self.schedule == "cosine" and self.total_steps:
            t = min(step, self.total_steps) / self.total_steps
            lr *= 0.5 * (1.0 + math.cos(math.pi * t))
        return lr


def async_momentum(momentum: float, workers: int) -> float:
    """The explicit momentum to apply with ``workers`` asynchronous workers so that, with the momentum asynchrony
    adds, the total is about ``momentum``; never below 0.

    Asynchrony begets momentum (Mitliagkas, Zhang, Hadjis and Re, 2016): with ``M`` workers pushing gradients
    computed on parameters about ``M - 1`` updates old, asynchronous SGD behaves like SGD with an implicit
    momentum of ``1 - 1/M`` on top of the explicit one. So 2 workers at momentum 0.9 train like one at about 1.4
    and can diverge where one worker converges; this applies ``max(0, momentum - (1 - 1/M))``: 0.4 for 2 workers,
    0.15 for 4, 0 from 10 workers on at 0.9.
    """
    if workers <= 1:
        return momentum
    return max(0.0, momentum - (1.0 - 1.0 / workers))

