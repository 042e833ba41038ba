"""A small forecaster: 32 past values in, the next value out."""

from __future__ import annotations

from torch import nn

from waves.data import WINDOW


def build_net(hidden: int = 64) -> nn.Module:
    """A two-hidden-layer perceptron over the window, with a layer norm (a buffer-free normaliser)."""
    return nn.Sequential(nn.Linear(WINDOW, hidden), nn.LayerNorm(hidden), nn.Tanh(),
                         nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1), nn.Flatten(0))
