"""Any ``torch.optim`` optimizer's state as a checkpoint holds it: flat arrays in model order.

SGD's momentum buffers are the checkpoint's ``momentum`` (the very array a parameter-server run stores, so a
checkpoint of either topology resumes in the other with SGD). Every other per-parameter state goes into the
checkpoint's ``optimizer`` arrays: a tensor of the parameter's shape (AdamW's ``exp_avg``, ``exp_avg_sq``)
flattened and concatenated in model order, a scalar (AdamW's ``step``) as one value per parameter. A parameter the
optimizer holds no state for yet (it never had a gradient) is written as zeros and marked absent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cmdare.ps.shard_optimizer import HAS_STATE_KEY  # one flag per parameter: the optimizer held state for it

__all__ = ["MOMENTUM_KEY", "load_optimizer_arrays", "optimizer_arrays"]

MOMENTUM_KEY = "momentum_buffer"  # SGD's per-parameter state: the checkpoint's ``momentum``


def optimizer_arrays(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]
                     ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(momentum, others)``: SGD's momentum buffers flat in model order (zeros where there are none), and every
    other per-parameter state as flat arrays by name."""
    sizes = [p.numel() for p in params]
    momentum = np.zeros(sum(sizes), dtype=np.float32)
    keys = sorted({k for p in params for k in optimizer.state.get(p, {}) if k != MOMENTUM_KEY})
    others: dict[str, np.ndarray] = {}
    for key in keys:
        tensor_like = any(torch.is_tensor(v := optimizer.state.get(p, {}).get(key)) and v.numel() == p.numel()
                          and v.dim() > 0 for p in params)
        values = [_value(optimizer.state.get(p, {}).get(key), p, tensor_like) for p in params]
        others[key] = np.concatenate(values) if tensor_like else np.array(values, dtype=np.float64)
    if others:
        others[HAS_STATE_KEY] = np.array([p in optimizer.state and bool(optimizer.state[p]) for p in params])
    at = 0
    for p, n in zip(params, sizes, strict=True):
        buf = optimizer.state.get(p, {}).get(MOMENTUM_KEY)
        if buf is not None:
            momentum[at:at + n] = buf.detach().reshape(-1).cpu().numpy()
        at += n
    return momentum, others


def _value(v: Any, p: torch.Tensor, tensor_like: bool) -> Any:
    if tensor_like:
        return v.detach().reshape(-1).cpu().numpy().astype(np.float32) if v is not None else \
            np.zeros(p.numel(), dtype=np.float32)
    return float(v) if v is not None else 0.0


def load_optimizer_arrays(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                          momentum: np.ndarray, others: dict[str, np.ndarray]) -> None:
    """Put :func:`optimizer_arrays`' state back into ``optimizer`` (its hyper-parameters stay as built). SGD with
    momentum takes ``momentum`` as its buffers; any other optimizer takes ``others``."""
    optimizer.state.clear()
    uses_momentum = any(g.get("momentum", 0) for g in optimizer.param_groups) and "betas" not in \
        optimizer.param_groups[0]
    has = others.get(HAS_STATE_KEY)
    at = 0
    for i, p in enumerate(params):
        n = p.numel()
        state: dict[str, Any] = {}
        if uses_momentum:
            state[MOMENTUM_KEY] = torch.from_numpy(np.array(momentum[at:at + n], dtype=np.float32)).view_as(p).to(p)
        if has is None or bool(has[i]):
            for key, arr in others.items():
                if key == HAS_STATE_KEY:
                    continue
                if arr.size == len(params) and arr.dtype == np.float64:  # one scalar per parameter
                    state[key] = torch.tensor(float(arr[i]), dtype=torch.float32)
                else:
                    state[key] = torch.from_numpy(np.array(arr[at:at + n], dtype=np.float32)).view_as(p).to(p)
        if state:
            optimizer.state[p] = state
        at += n
