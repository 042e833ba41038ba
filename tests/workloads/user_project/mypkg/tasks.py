"""A user's regression task (data, model, loss, metric) and the ways each part can go wrong."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def vectors(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """y = x @ w + noise, 8 features: 512 training and 128 test samples made from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, generator=g)
    x = torch.randn(640, 8, generator=g)
    y = x @ w + 0.01 * torch.randn(640, generator=g)
    return TensorDataset(x[:512], y[:512]), TensorDataset(x[512:], y[512:])


def vector_loader(seed: int = 0) -> DataLoader:
    """The training vectors as a DataLoader (its dataset and collate function are what a run uses)."""
    return DataLoader(vectors(seed)[0], batch_size=7, shuffle=True)


def build_regressor() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1), nn.Flatten(0))


def build_double() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 1), nn.Flatten(0)).double()


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


def per_sample_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y, reduction="none")  # forgot to reduce


def mae(out: torch.Tensor, y: torch.Tensor) -> float:
    return float((out - y).abs().mean())


def empty_set() -> TensorDataset:
    return TensorDataset(torch.zeros(0, 8), torch.zeros(0))


def broken_set(seed: int = 0) -> TensorDataset:
    raise ValueError("no data here")
