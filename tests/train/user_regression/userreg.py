"""A user's 2-layer regression (issue 42): Linear 8->32, Tanh, Linear 32->1, MSE, 2,048 samples."""
import torch
import torch.nn.functional as F


def build():
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _make(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=torch.Generator().manual_seed(99))
    y = torch.sin(x) @ w + 0.05 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def data(seed=0):
    return _make(2048, 1), _make(512, 2)


def loss(out, y):
    return F.mse_loss(out, y)


def nan_loss(out, y):
    """A loss that is NaN from the first step (a user's bug): divergence before anything is stored."""
    return F.mse_loss(out, y) * float("nan")


_CALLS = {"n": 0}


def exploding_loss(out, y):
    """A loss whose value explodes after 60 steps of a process while its gradient stays the MSE's: a finite
    divergence (the parameters stay finite) that only the loss's growth shows."""
    _CALLS["n"] += 1
    mse = F.mse_loss(out, y)
    return mse + (1e6 - 1.0) * mse.detach() if _CALLS["n"] > 60 else mse
