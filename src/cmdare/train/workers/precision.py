"""A worker's arithmetic precision (``--precision``): ``fp32``, ``amp-bf16`` or ``amp-fp16`` (PyTorch's automatic
mixed precision: the forward pass and the loss run under ``torch.autocast``, matrix products and convolutions in
bfloat16 or float16; the parameters, their gradients and everything the shards hold stay float32).

``amp-fp16`` scales the loss before the backward pass (float16's narrow range would flush small gradients to zero)
with :class:`LossScale`, the policy of ``torch.amp.GradScaler``: the worker brings the whole gradient to host memory,
checks it, and pushes it unscaled; a gradient with an overflow is not pushed, the scale halves and the worker takes
the next batch. So an ``amp-fp16`` worker pushes after its backward pass, never in pieces during it (``--overlap``
applies to ``fp32`` and ``amp-bf16``). An all-reduce member checks the group's averaged gradient instead, so every
member skips the same steps (:class:`~cmdare.train.allreduce.replica.Replica`). bfloat16 has float32's range and
needs no scaling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cmdare.errors import UserInputError
from cmdare.option_values import PRECISIONS, check_precision

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["PRECISIONS", "LossScale", "check_precision", "forward_precision", "loss_scale_for"]


def forward_precision(precision: str, device: torch.device) -> Callable[[], Any]:
    """A factory of the context the forward pass and the loss run in on ``device``: ``torch.autocast`` in bfloat16
    or float16 for ``amp-bf16`` / ``amp-fp16``, nothing for ``fp32``.

    Raises:
        UserInputError: ``amp-bf16`` on a GPU without bfloat16 (before Ampere), ``amp-fp16`` on one without fast
            float16 (before Pascal), or an unknown precision.
    """
    import torch

    if check_precision(precision) == "fp32":
        return contextlib.nullcontext
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if precision == "amp-bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
            raise UserInputError(f"--precision amp-bf16: {name} has no bfloat16 arithmetic (it came with Ampere GPUs: "
                                 "A100, L4, H100); use amp-fp16 or fp32")
        if precision == "amp-fp16" and torch.cuda.get_device_capability(device) < (6, 0):
            raise UserInputError(f"--precision amp-fp16: {name} has no fast float16 arithmetic (it came with Pascal "
                                 "GPUs: P100); use fp32")
    dtype = torch.bfloat16 if precision == "amp-bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


class LossScale:
    """Dynamic loss scaling for float16 (``torch.amp.GradScaler``'s policy), stepped by its calls: no clock.

    The loss is multiplied by :attr:`scale` before the backward pass; :meth:`unscale` then divides the gradient by
    it, or, when the gradient holds an infinity or a NaN, leaves it, halves the scale and says to skip the step.
    After ``growth_interval`` finite steps in a row the scale doubles.

    Attributes:
        scale: the current loss scale.
        skipped: steps skipped for an overflow so far.
    """

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 2000, min_scale: float = 1.0):
        self.scale = float(scale)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.skipped = 0
        self._finite_run = 0
        self.exhausted = False  # an overflow at the smallest scale: the gradient itself is not finite

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the scale (what the backward pass starts from)."""
        return loss * self.scale

    def unscale(self, grads: np.ndarray) -> bool:
        """Divide ``grads`` (the flat gradient, in place) by the scale and return True; or, on an overflow, leave
        it, halve the scale (not below ``min_scale``: then :attr:`exhausted`) and return False."""
        import numpy as np

        inverse = np.float32(1.0 / self.scale)
        if not self.update(bool(np.isfinite(grads).all())):
            return False
        grads *= inverse
        return True

    def update(self, finite: bool) -> bool:
        """The policy alone, for a gradient unscaled elsewhere: a finite one counts towards growth (True: take the
        step); an overflow halves the scale (not below ``min_scale``: then :attr:`exhausted`; False: skip it).
        Read the scale to divide the gradient by *before* this call: a growth changes it."""
        if not finite:
            self.exhausted = self.scale <= self.min_scale
            self.scale = max(self.scale / 2.0, self.min_scale)
            self.skipped += 1
            self._finite_run = 0
            return False
        self._finite_run += 1
        if self._finite_run >= self.growth_interval:
            self.scale *= 2.0
            self._finite_run = 0
        return True

    def state_dict(self) -> dict[str, float | int]:
        """The scale and its growth count (what a member joining an ``amp-fp16`` group takes from a peer)."""
        return {"scale": self.scale, "finite_run": self._finite_run, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        """Take :meth:`state_dict`'s values."""
        self.scale, self._finite_run = float(state["scale"]), int(state["finite_run"])
        self.skipped, self.exhausted = int(state["skipped"]), False


    def chunk_report(self, skipped_before: int) -> dict[str, float | int]:
        """A worker's chunk: the overflows since ``skipped_before`` (the count at its start) and the scale now."""
        return {"overflow_skips": self.skipped - skipped_before, "loss_scale": self.scale}


def loss_scale_for(precision: str) -> LossScale | None:
    """A fresh :class:`LossScale` for ``amp-fp16``; None for the precisions that need none."""
    return LossScale() if check_precision(precision) == "amp-fp16" else None
