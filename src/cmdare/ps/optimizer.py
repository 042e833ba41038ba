"""The optimizer that runs on the shards: SGD with momentum, weight decay and an LR schedule.

The update is written with the same torch ops, in the same order, as ``torch.optim.SGD``, applied
to a shard's flat buffers, so PS training reproduces single-process SGD to float tolerance.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

# The configuration is its own module (no torch: a run's spec is checked before torch is imported).
from cmdare.ps.optimizer_config import SCHEDULES, OptimizerConfig

__all__ = ["SCHEDULES", "UPDATE_CHUNK_ELEMS", "OptimizerConfig", "sgd_update", "shared_tensor"]

# Elements per chunk of the shard update (1 MiB of float32): the operands of a chunk stay in cache.
# Measured on 2 cores (bench/ps_datapath.py notes): 25-35% faster than whole-buffer ops at 10-40 MB,
# and the scratch buffer shrinks from the shard's size to 1 MiB.
UPDATE_CHUNK_ELEMS = 1 << 18


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
    p_all, g_all, b_all = torch.from_numpy(param), shared_tensor(grad), torch.from_numpy(buf)
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


def shared_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory, also when the array is read-only (never written)."""
    if not array.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    return torch.from_numpy(array)
