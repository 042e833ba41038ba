"""Parameter blocks: the unit a placement assigns to a shard and a migration moves.

A block is a whole parameter tensor or a contiguous slice of its flattened view. Every shard keeps
its blocks in one flat float32 buffer, so a push or pull moves one array per shard per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

BYTES_PER_ELEM = 4  # float32


@dataclass(frozen=True)
class ParamInfo:
    """A model parameter as the placement sees it: its position, name and shape."""

    index: int  # position in ``model.parameters()`` order
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES_PER_ELEM


@dataclass(frozen=True)
class Block:
    """A contiguous slice ``[start, start + size)`` of parameter ``param_index``'s flat view."""

    block_id: int
    param_index: int
    name: str
    start: int
    size: int

    @property
    def nbytes(self) -> int:
        return self.size * BYTES_PER_ELEM


def param_infos(named_shapes: Iterable[tuple[str, Sequence[int]]]) -> list[ParamInfo]:
    """Describe parameters given ``(name, shape)`` pairs in model order."""
    return [ParamInfo(i, name, tuple(int(d) for d in shape)) for i, (name, shape) in enumerate(named_shapes)]


def split_blocks(params: Sequence[ParamInfo], max_block_elems: int | None = None) -> list[Block]:
    """Cut parameters into blocks of at most ``max_block_elems`` elements (None: one block each).

    Block ids are consecutive in model order, so sorting by id restores the model's layout.
    """
    if max_block_elems is not None and max_block_elems < 1:
        raise ValueError("max_block_elems must be positive")
    blocks: list[Block] = []
    for p in params:
        step = p.numel if max_block_elems is None else max_block_elems
        for start in range(0, max(p.numel, 1), max(step, 1)):
            size = min(step, p.numel - start)
            blocks.append(Block(len(blocks), p.index, p.name, start, size))
    return blocks


def model_offsets(params: Sequence[ParamInfo]) -> list[int]:
    """Offset of each parameter in the model-order flat vector (length ``len(params) + 1``)."""
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel)
    return offsets
