"""Windows of noisy sine waves: the input is 32 past values, the target the next one."""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

WINDOW = 32


class SineWindows(Dataset):
    """``count`` windows of sine waves of random frequency, phase and amplitude, with a little noise,
    made from ``seed`` (the same windows on every node)."""

    def __init__(self, count: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        freq = 0.05 + 0.25 * torch.rand(count, 1, generator=g)
        phase = 2 * math.pi * torch.rand(count, 1, generator=g)
        amp = 0.5 + torch.rand(count, 1, generator=g)
        t = torch.arange(WINDOW + 1, dtype=torch.float32)
        waves = amp * torch.sin(freq * t + phase) + 0.05 * torch.randn(count, WINDOW + 1, generator=g)
        self.inputs, self.targets = waves[:, :WINDOW].contiguous(), waves[:, WINDOW].contiguous()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


def make_sets(seed: int = 0) -> tuple[SineWindows, SineWindows]:
    """The training and test windows (cmdare passes the run's seed)."""
    return SineWindows(4096, seed), SineWindows(512, seed + 1)
