"""A worker's view of the placement: model parameters bound to per-shard flat buffers.

Parameters and gradients of whole-tensor blocks are *views* into one flat buffer ordered by
shard, so pushing shard ``k``'s gradient is a slice (no gather) and pulling is one copy per
shard. Tensors split over several blocks cannot be views of one contiguous range; they are
copied piece by piece (the MXNet/BytePS placements slice large tensors).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from cmdare.ps.blocks import Block, ParamInfo, model_offsets
from cmdare.ps.placement import Placement
from cmdare.ps.shard_optimizer import HAS_STATE_KEY, OptimizerSlots, ShardOptimizer


class FlatLayout:
    """Binds ``params`` (in model order) to flat buffers laid out by ``placement``.

    ``host`` (parameters, gradients: 1-D float32 CPU tensors of the model's size) is where the host
    buffers live, e.g. shared memory a same-node shard writes into; by default they are allocated here
    (pinned when the model is on a GPU). On the CPU the host buffers are the model's own storage.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], placement: Placement,
                 device: torch.device | str = "cpu", host: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.params = list(params)
        self.placement = placement
        self.device = torch.device(device)
        self.shard_ranges: list[tuple[int, int]] = []
        self._pieces: dict[int, list[tuple[int, int, int]]] = {}  # param -> (param_start, flat_pos, size)
        pos = 0
        for shard in range(placement.num_shards):
            start = pos
            for b in placement.blocks_on(shard):
                self._pieces.setdefault(b.param_index, []).append((b.start, pos, b.size))
                pos += b.size
            self.shard_ranges.append((start, pos))
        self.numel = pos
        if self.numel != sum(p.numel() for p in self.params):
            raise ValueError("placement does not cover the model's parameters exactly")
        on_cpu = self.device.type == "cpu"
        if host is not None:
            if any(t.numel() != self.numel or t.dtype != torch.float32 for t in host):
                raise ValueError(f"host buffers must be {self.numel} float32 values each")
            self._host_params, self._host_grads = host
        else:
            self._host_params = torch.zeros(self.numel) if on_cpu else torch.zeros(self.numel).pin_memory()
            self._host_grads = torch.zeros(self.numel) if on_cpu else torch.zeros(self.numel).pin_memory()
        self.flat_params = self._host_params if on_cpu else torch.zeros(self.numel, device=self.device)
        self.flat_grads = self._host_grads if on_cpu else torch.zeros(self.numel, device=self.device)
        self.host_params_np = self._host_params.numpy()
        self.host_grads_np = self._host_grads.numpy()
        self._split: list[int] = []
        for i, p in enumerate(self.params):
            pieces = sorted(self._pieces[i])
            with torch.no_grad():
                if len(pieces) == 1:
                    _, flat_pos, size = pieces[0]
                    self.flat_params[flat_pos:flat_pos + size].copy_(p.detach().reshape(-1))
                    p.data = self.flat_params[flat_pos:flat_pos + size].view_as(p)
                    p.grad = self.flat_grads[flat_pos:flat_pos + size].view_as(p)
                else:
                    self._split.append(i)
                    flat_p = p.detach().reshape(-1)
                    for start, flat_pos, size in pieces:
                        self.flat_params[flat_pos:flat_pos + size].copy_(flat_p[start:start + size])
                    p.grad = torch.zeros_like(p)

    def param_spans(self) -> dict[int, tuple[int, int]] | None:
        """Each parameter's range ``[lo, hi)`` in the flat buffer, or None when a tensor is split over blocks."""
        if self._split:
            return None
        return {i: (pieces[0][1], pieces[0][1] + pieces[0][2]) for i, pieces in self._pieces.items()}

    def zero_grads(self) -> None:
        self.flat_grads.zero_()
        for i in self._split:
            self.params[i].grad.zero_()

    def grads_to_host(self) -> None:
        """Gather split tensors' gradients into the flat buffer and bring it to host memory."""
        for i in self._split:
            g = self.params[i].grad.reshape(-1)
            for start, flat_pos, size in self._pieces[i]:
                self.flat_grads[flat_pos:flat_pos + size].copy_(g[start:start + size])
        if self._host_grads is not self.flat_grads:
            self._host_grads.copy_(self.flat_grads)

    def grads_range_to_host(self, lo: int, hi: int) -> None:
        """Bring elements ``[lo, hi)`` of the flat gradient to host memory (nothing to do on the CPU)."""
        if self._host_grads is not self.flat_grads:
            self._host_grads[lo:hi].copy_(self.flat_grads[lo:hi])

    def shard_grad(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s gradient slice (host memory, no copy)."""
        a, b = self.shard_ranges[shard]
        return self.host_grads_np[a:b]

    def set_shard_params(self, shard: int, values: np.ndarray) -> None:
        """Copy shard ``shard``'s pulled parameters into the host flat buffer."""
        a, b = self.shard_ranges[shard]
        np.copyto(self.host_params_np[a:b], values)

    def host_to_params(self) -> None:
        """Make the model's parameters reflect the host flat buffer (after all shards are pulled)."""
        if self._host_params is not self.flat_params:
            self.flat_params.copy_(self._host_params, non_blocking=True)
        with torch.no_grad():
            for i in self._split:
                flat_p = self.params[i].data.reshape(-1)
                for start, flat_pos, size in self._pieces[i]:
                    flat_p[start:start + size].copy_(self.flat_params[flat_pos:flat_pos + size])

    def params_finite(self) -> bool:
        """Whether every parameter in the host flat buffer (the latest pulled) is finite."""
        return bool(torch.isfinite(self._host_params).all())

    def shard_values(self, shard: int) -> np.ndarray:
        """A copy of shard ``shard``'s current parameter values in its buffer order."""
        a, b = self.shard_ranges[shard]
        if self._host_params is not self.flat_params:
            self._host_params.copy_(self.flat_params)
        return self.host_params_np[a:b].copy()


def flat_model_params(params: Sequence[torch.Tensor]) -> np.ndarray:
    """All parameters concatenated in model order (the checkpoint layout)."""
    return torch.cat([p.detach().reshape(-1).cpu() for p in params]).numpy().copy()


def load_model_flat(params: Iterable[torch.Tensor], values: torch.Tensor) -> None:
    """Copy the model-order flat ``values`` into ``params`` in place (the inverse of :func:`flat_model_params`;
    views of the parameters stay valid)."""
    at = 0
    with torch.no_grad():
        for p in params:
            p.copy_(values[at:at + p.numel()].view_as(p))
            at += p.numel()


def shard_arrays_from_model_flat(model_flat: np.ndarray, infos: Sequence[ParamInfo],
                                 placement: Placement) -> list[np.ndarray]:
    """Cut a model-order flat vector into each shard's buffer (blocks in block-id order)."""
    offsets = model_offsets(infos)
    out = []
    for shard in range(placement.num_shards):
        parts = [model_flat[offsets[b.param_index] + b.start: offsets[b.param_index] + b.start + b.size]
                 for b in placement.blocks_on(shard)]
        out.append(np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32))
    return out


def model_flat_from_shard_arrays(shard_blocks: Sequence[Sequence[Block]], arrays: Sequence[np.ndarray],
                                 infos: Sequence[ParamInfo]) -> np.ndarray:
    """Inverse of :func:`shard_arrays_from_model_flat`: reassemble the model-order vector."""
    offsets = model_offsets(infos)
    out = np.zeros(offsets[-1], np.float32)
    for blocks, arr in zip(shard_blocks, arrays, strict=True):
        pos = 0
        for b in blocks:
            start = offsets[b.param_index] + b.start
            out[start:start + b.size] = arr[pos:pos + b.size]
            pos += b.size
    return out


def model_optimizer_state(shard_blocks: Sequence[Sequence[Block]], slots: Sequence[OptimizerSlots | None],
                          infos: Sequence[ParamInfo]) -> dict[str, np.ndarray]:
    """The shards' optimizer state as a checkpoint holds it (the all-reduce members' layout,
    :mod:`cmdare.train.allreduce.optimizer_state`): each per-element state flat in model order, each scalar one
    value per parameter (its first block's), and which parameters have state. Empty with SGD (its momentum is the
    checkpoint's ``momentum``)."""
    held = [s for s in slots if s is not None]
    if not held:
        return {}
    out = {k: model_flat_from_shard_arrays(shard_blocks, [s.elements[k] for s in held], infos)
           for k in held[0].elements}
    scalars = {k: np.zeros(len(infos), np.float64) for k in held[0].scalars}
    has = np.zeros(len(infos), dtype=bool)
    for blocks, state in zip(shard_blocks, held, strict=True):
        for i, b in enumerate(blocks):
            if b.start == 0:
                has[b.param_index] = state.has_state[i]
                for k, v in scalars.items():
                    v[b.param_index] = state.scalars[k][i]
    return {**out, **scalars, HAS_STATE_KEY: has}


def shard_optimizer_state(arrays: dict[str, np.ndarray], infos: Sequence[ParamInfo], placement: Placement,
                          optimizer: ShardOptimizer) -> list[OptimizerSlots | None]:
    """Each shard's part of a checkpoint's optimizer state (:func:`model_optimizer_state`); None for every shard
    when the checkpoint holds none (a fresh run, or one trained with SGD: the optimizer starts fresh).

    Raises:
        ValueError: the checkpoint holds another optimizer's state.
    """
    keys = set(arrays) - {HAS_STATE_KEY}
    if not keys:
        return [None] * placement.num_shards
    if keys != set(optimizer.element_keys) | set(optimizer.scalar_dtypes):
        raise ValueError(f"the checkpoint holds optimizer state {sorted(keys)}, not --optimizer {optimizer.name}'s")
    has = arrays.get(HAS_STATE_KEY, np.ones(len(infos), dtype=bool))
    elements = {k: shard_arrays_from_model_flat(arrays[k], infos, placement) for k in optimizer.element_keys}
    out: list[OptimizerSlots | None] = []
    for shard in range(placement.num_shards):
        blocks = placement.blocks_on(shard)
        index = [b.param_index for b in blocks]
        out.append(OptimizerSlots({k: v[shard] for k, v in elements.items()},
                                  {k: np.asarray(arrays[k], np.float64)[index] for k in optimizer.scalar_dtypes},
                                  np.asarray(has, dtype=bool)[index]))
    return out
