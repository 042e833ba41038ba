"""The loss and the metric of the forecaster."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the forecast."""
    return F.mse_loss(output, target)


def mae(output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Mean absolute error of the forecast (the batch mean)."""
    return {"mae": float((output - target).abs().mean())}
