"""The optimizer that runs on the shards: SGD with momentum, weight decay and an LR schedule.

The update is written with the same torch ops, in the same order, as ``torch.optim.SGD``, applied
to a shard's flat buffers, so PS training reproduces single-process SGD to float tolerance.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from cmdare.errors import UnknownNameError, UserInputError

SCHEDULES = ("constant", "step", "cosine")
# Elements per chunk of the shard update (1 MiB of float32): the operands of a chunk stay in cache.
# Measured on 2 cores (bench/ps_datapath.py notes): 25-35% faster than whole-buffer ops at 10-40 MB,
# and the scratch buffer shrinks from the shard's size to 1 MiB.
UPDATE_CHUNK_ELEMS = 1 << 18


@dataclass(frozen=True)
class OptimizerConfig:
    """SGD hyper-parameters and the learning-rate schedule (a function of the global step)."""

    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    schedule: str = "constant"  # constant | step | cosine
    warmup_steps: int = 0
    decay_steps: tuple[int, ...] = ()  # for "step": steps at which lr *= decay_factor
    decay_factor: float = 0.1
    total_steps: int = 0  # for "cosine"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise UnknownNameError("learning-rate schedule", self.schedule, SCHEDULES)
        for name in ("lr", "momentum", "weight_decay", "decay_factor"):
            if not math.isfinite(getattr(self, name)):
                raise UserInputError(f"--{name.replace('_', '-')} must be a finite number, got {getattr(self, name)}")
        if self.lr <= 0 or self.momentum < 0 or self.weight_decay < 0:
            raise UserInputError("lr must be positive; momentum and weight decay non-negative")
        if self.nesterov and self.momentum == 0:
            raise UserInputError("nesterov momentum needs momentum > 0")

    def lr_at(self, step: int, lr_scale: float = 1.0) -> float:
        """Learning rate for the update applied at global ``step`` (0-based)."""
        lr = self.lr * lr_scale
        if self.warmup_steps and step < self.warmup_steps:
            return lr * (step + 1) / self.warmup_steps
        if self.schedule == "step":
            lr *= self.decay_factor ** sum(step >= s for s in self.decay_steps)
        elif self.schedule == "cosine" and self.total_steps:
            t = min(step, self.total_steps) / self.total_steps
            lr *= 0.5 * (1.0 + math.cos(math.pi * t))
        return lr


def sgd_update(param: np.ndarray, grad: np.ndarray, buf: np.ndarray, lr: float, cfg: OptimizerConfig,
               scratch: np.ndarray | None = None, out: np.ndarray | None = None) -> None:
    """Apply one SGD step in place to ``param`` and its momentum ``buf`` (flat float32 arrays).

    ``buf`` starts as zeros: ``0 * momentum + d_p`` equals torch's first-step ``buf = d_p`` exactly.
    ``grad`` may be read-only (zero-copy from Ray's object store). The update runs chunk by chunk
    (``len(scratch)`` elements, at most :data:`UPDATE_CHUNK_ELEMS`) so a chunk's operands stay in
    cache and the weight-decayed gradient needs only a chunk-sized ``scratch``; every element goes
    through the same ops in the same order, so the result is bit-identical to whole-buffer ops.
    ``out`` (as large as ``param``) receives a copy of the updated parameters, chunk by chunk while the
    chunk is in cache (a same-node worker's parameter memory).
    """
    p_all, g_all, b_all = torch.from_numpy(param), _as_tensor(grad), torch.from_numpy(buf)
    n = p_all.numel()
    if scratch is None or scratch.size == 0:
        scratch = np.empty(min(n, UPDATE_CHUNK_ELEMS), np.float32)
    chunk = max(1, min(scratch.size, UPDATE_CHUNK_ELEMS))
    s_all = torch.from_numpy(scratch)
    o_all = torch.from_numpy(out) if out is not None else None
    wd, mu = cfg.weight_decay, cfg.momentum
    for a in range(0, n, chunk):
        p = p_all[a:a + chunk]
        d_p = g_all[a:a + chunk]
        if wd:
            d_p = torch.add(d_p, p, alpha=wd, out=s_all[:p.numel()])
        if mu:
            b = b_all[a:a + chunk]
            b.mul_(mu).add_(d_p)
            d_p = d_p.add(b, alpha=mu) if cfg.nesterov else b
        p.add_(d_p, alpha=-lr)
        if o_all is not None:
            o_all[a:a + chunk].copy_(p)


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory, also when the array is read-only (never written)."""
    if not array.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    return torch.from_numpy(array)
