"""Mistakes a practitioner's code makes, each where a run meets it: in a factory, at the one-batch check, or only
after some steps on a worker (items and forward passes that go wrong after ``LATE`` calls in a process, so the
driver's check passes and a worker meets them)."""

from __future__ import annotations

import sys
import threading

import torch
from torch import nn
from torch.utils.data import Dataset

from mypkg.tasks import build_regressor, vectors

LATE = 200  # items fetched (or forward passes run) in one process before the mistake shows


class LateItems(Dataset):
    """The training vectors, whose item ``LATE`` calls after the first goes wrong as ``how`` says."""

    def __init__(self, base: Dataset, how: str):
        self.base, self.how, self.calls = base, how, 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        self.calls += 1
        if self.calls <= LATE:
            return self.base[i]
        if self.how == "raise":
            raise ValueError(f"corrupt record {i}")
        if self.how == "none":
            return None
        x, y = self.base[i]
        return torch.cat([x, x[:1]]), y  # one feature too many


def late_raising_set(seed: int = 0):
    train, test = vectors(seed)
    return LateItems(train, "raise"), test


def late_none_set(seed: int = 0):
    train, test = vectors(seed)
    return LateItems(train, "none"), test


def late_ragged_set(seed: int = 0):
    train, test = vectors(seed)
    return LateItems(train, "ragged"), test


class Huge(Dataset):
    """A dataset that says it holds 10^12 samples."""

    def __len__(self) -> int:
        return 10**12

    def __getitem__(self, i: int):
        return torch.zeros(8), torch.zeros(())


def huge_set() -> Huge:
    return Huge()


def ragged_set() -> Dataset:
    """Items of two lengths from the start: the first batch does not collate."""
    train, _ = vectors(0)
    return [(x if i % 2 else torch.cat([x, x]), y) for i, (x, y) in enumerate(train)]


class LateFailing(nn.Module):
    """The regressor, whose forward pass in training fails after ``LATE`` calls in a process."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = build_regressor(), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls > LATE // 10:
                raise RuntimeError("the hidden state went stale")
        return self.net(x)


def build_late_failing() -> nn.Module:
    return LateFailing()


def build_frozen() -> nn.Module:
    model = build_regressor()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def build_locked() -> nn.Module:
    """A model that cannot be copied (it holds a lock), so it cannot be profiled: it trains all the same."""
    model = build_regressor()
    model.lock = threading.Lock()
    return model


def build_exits() -> nn.Module:
    sys.exit(5)


def build_interrupted() -> nn.Module:
    raise KeyboardInterrupt


#: What the "forever" factories wait for: never set in a run; a test in the same process sets it when it is done, so
#: the helper threads its bounded calls leave behind end instead of holding the test session's CPU and GIL.
RELEASE = threading.Event()


def build_forever() -> nn.Module:
    RELEASE.wait()  # never returns (in a run)
    raise SystemExit(0)


def data_forever(seed: int = 0):
    RELEASE.wait()
    raise SystemExit(0)


def constant_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.tensor(1.0)


def error_count(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y).abs() > 0.5).sum()


def wrong_test_set(seed: int = 0):
    """Training vectors of 8 features; test vectors of 9."""
    from torch.utils.data import TensorDataset

    train, _ = vectors(seed)
    return train, TensorDataset(torch.zeros(64, 9), torch.zeros(64))
