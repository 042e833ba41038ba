"""A worker's arithmetic precision (``--precision``): ``fp32``, or ``amp-bf16`` (PyTorch's automatic mixed precision
in bfloat16: the forward pass and the loss run under ``torch.autocast``, matrix products and convolutions in bfloat16,
the parameters, their gradients and everything the shards hold in float32).

``amp-fp16`` is refused: float16's narrow range needs loss scaling (a gradient scaled up before the backward pass, then
unscaled and checked for overflow before it is applied), which cmdare does not do yet. By default a worker pushes its
gradient to the shards in pieces while the backward pass runs (``--overlap``), so a piece leaves before the step can
know whether any part overflowed: the check would have to move to the shards. bfloat16 has float32's range and needs
no scaling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cmdare.errors import UnknownNameError, UserInputError

if TYPE_CHECKING:
    import torch

__all__ = ["PRECISIONS", "check_precision", "forward_precision"]

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16")


def check_precision(precision: str) -> str:
    """``precision`` if the trainer runs it.

    Raises:
        UnknownNameError: not one of :data:`PRECISIONS`.
        UserInputError: ``amp-fp16`` (see the module's docstring).
    """
    if precision not in PRECISIONS:
        raise UnknownNameError("--precision", str(precision), list(PRECISIONS))
    if precision == "amp-fp16":
        raise UserInputError("--precision amp-fp16 needs loss scaling, which cmdare does not do yet (a worker pushes "
                             "its gradient in pieces during the backward pass, before an overflow could be seen); "
                             "use amp-bf16 (bfloat16 has float32's range, no scaling needed) or fp32")
    return precision


def forward_precision(precision: str, device: torch.device) -> Callable[[], Any]:
    """A factory of the context the forward pass and the loss run in on ``device``: ``torch.autocast`` in bfloat16
    for ``amp-bf16``, nothing for ``fp32``.

    Raises:
        UserInputError: ``amp-bf16`` on a GPU without bfloat16 (before Ampere), or an unknown precision.
    """
    import torch

    if check_precision(precision) == "fp32":
        return contextlib.nullcontext
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UserInputError(f"--precision amp-bf16: {torch.cuda.get_device_name(device)} has no bfloat16 arithmetic "
                             "(it came with Ampere GPUs: A100, L4, H100); use fp32")
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
