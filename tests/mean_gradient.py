"""The reference data-parallel step of the equivalence tests: each member's gradient on its own batch, averaged."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F


def set_mean_gradient(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                      weights: list[float] | None = None,
                      forward: Callable[[], Any] = contextlib.nullcontext,
                      scale: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """Put into ``model``'s ``.grad`` the mean over ``batches`` of the cross-entropy gradient of each batch
    computed alone (batch norm normalising each batch by itself), summed in the batches' order; with ``weights``,
    their weighted sum instead (each batch's share of a global batch). ``forward``: the context of the forward
    pass and the loss (``torch.autocast`` for mixed precision); ``scale``: what each loss goes through before its
    backward pass (``torch.amp.GradScaler.scale``; the gradient is left scaled)."""
    params = list(model.parameters())
    total, count = None, 0
    for i, (x, y) in enumerate(batches):
        for p in params:
            p.grad = None
        with forward():
            loss = F.cross_entropy(model(x), y)
        (scale(loss) if scale is not None else loss).backward()
        g = torch.cat([p.grad.reshape(-1) for p in params])
        if weights is not None:
            g.mul_(weights[i])
        total = g if total is None else total.add_(g)
        count += 1
    if count > 1 and weights is None:
        total.div_(count)
    offset = 0
    for p in params:
        p.grad = total[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()
