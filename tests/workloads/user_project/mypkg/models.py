"""A user's CNN factory and the ways a factory can go wrong."""

from __future__ import annotations

import torch
from torch import nn


def build_net(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """A small CNN: two convolutions, global pooling, a classifier."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def build_fixed() -> nn.Module:
    """A factory that takes no argument (its sizes fixed)."""
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def broken(num_classes: int = 10) -> nn.Module:
    raise ValueError("width must be even")


def not_a_model() -> dict:
    return {"weights": torch.zeros(3)}


NOT_CALLABLE = 3
