"""Static placement baselines (greedy, MXNet, BytePS) and PSLD's initial placement.

Each strategy is registered by name with :func:`cmdare.ps.placement_base.register_placement` when
this module is imported (``cmdare.ps.placement`` imports it), so ``get_placement("mxnet")`` works.
Hashing uses deterministic functions of the tensor name (CRC-32, djb2), never Python's salted
``hash()``, so a placement is the same in every process and every run.

- ``greedy``: each whole tensor, in model order, to the shard with the fewest bytes so far
  (TensorFlow's ``GreedyLoadBalancingStrategy`` with ``byte_size_load_fn``).
- ``mxnet``: arrays under 1,000,000 elements hashed to one server; larger ones sliced evenly over all
  servers (MXNet kvstore, ``MXNET_KVSTORE_BIGARRAY_BOUND``).
- ``byteps``: every tensor cut into fixed 4 MB partitions, each hashed to a server (BytePS,
  ``BYTEPS_PARTITION_BYTES`` = 4,096,000 and its djb2 key hash).
- ``psld``: tensors cut into blocks no larger than a bound, blocks balanced by bytes (largest first);
  PSLD's starting point, which the live balancer (:mod:`cmdare.ps.psld`) then improves.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Sequence

from cmdare.errors import UserInputError
from cmdare.ps.blocks import BYTES_PER_ELEM, Block, ParamInfo, split_blocks
from cmdare.ps.placement_base import Placement, PlacementStrategy, register_placement

__all__ = [
    "BYTEPS_PARTITION_BYTES",
    "MXNET_BIGARRAY_BOUND",
    "BytePSPlacement",
    "GreedyPlacement",
    "MXNetPlacement",
    "PsldPlacement",
    "djb2",
    "name_hash",
]

MXNET_BIGARRAY_BOUND = 1_000_000  # elements; MXNet's MXNET_KVSTORE_BIGARRAY_BOUND default
BYTEPS_PARTITION_BYTES = 4_096_000  # BytePS's BYTEPS_PARTITION_BYTES default ("4 MB")


def name_hash(name: str) -> int:
    """A deterministic 32-bit hash of ``name`` (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(name.encode("utf-8"))


def djb2(text: str) -> int:
    """Dan Bernstein's djb2 string hash, 64-bit (BytePS's default key hash)."""
    h = 5381
    for ch in text.encode("utf-8"):
        h = ((h << 5) + h + ch) & 0xFFFFFFFFFFFFFFFF
    return h


def _check_shards(num_shards: int) -> None:
    if num_shards < 1:
        raise UserInputError(f"a placement needs at least one shard, got {num_shards}")


def _slices(params: Sequence[ParamInfo], sizes_of) -> list[Block]:
    """Blocks with consecutive ids in model order; ``sizes_of(p)`` gives each param's slice sizes."""
    blocks: list[Block] = []
    for p in params:
        start = 0
        for size in sizes_of(p):
            blocks.append(Block(len(blocks), p.index, p.name, start, size))
            start += size
    return blocks


def _even_sizes(numel: int, parts: int) -> list[int]:
    """``numel`` cut into ``parts`` slices whose sizes differ by at most one (no empty slice)."""
    parts = max(1, min(parts, numel))
    q, r = divmod(numel, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


class GreedyPlacement(PlacementStrategy):
    """TensorFlow's greedy load balancing: each tensor to the shard with the fewest bytes so far."""

    name = "greedy"

    def place(self, params: Sequence[ParamInfo], num_shards: int) -> Placement:
        _check_shards(num_shards)
        blocks = split_blocks(params)
        loads = [(0, s) for s in range(num_shards)]  # (bytes, shard): ties go to the lowest index
        heapq.heapify(loads)
        shard_of = []
        for b in blocks:
            load, s = heapq.heappop(loads)
            shard_of.append(s)
            heapq.heappush(loads, (load + b.nbytes, s))
        return Placement(tuple(blocks), tuple(shard_of), num_shards, strategy=self.name)


class MXNetPlacement(PlacementStrategy):
    """MXNet's kvstore: small arrays hashed to one server, big arrays sliced evenly over all servers.

    MXNet hashes the integer key (``key * 9973 % num_servers``); cmdare hashes the parameter name so
    the placement does not change when layers are inserted before it.
    """

    name = "mxnet"

    def __init__(self, bigarray_bound: int = MXNET_BIGARRAY_BOUND):
        if bigarray_bound < 1:
            raise UserInputError(f"bigarray_bound must be positive, got {bigarray_bound}")
        self.bigarray_bound = bigarray_bound

    def place(self, params: Sequence[ParamInfo], num_shards: int) -> Placement:
        _check_shards(num_shards)
        blocks: list[Block] = []
        shard_of: list[int] = []
        for p in params:
            if p.numel < self.bigarray_bound:
                blocks.append(Block(len(blocks), p.index, p.name, 0, p.numel))
                shard_of.append(name_hash(p.name) % num_shards)
                continue
            start = 0
            for i, size in enumerate(_even_sizes(p.numel, num_shards)):  # slice i to server i
                blocks.append(Block(len(blocks), p.index, p.name, start, size))
                shard_of.append(i % num_shards)
                start += size
        return Placement(tuple(blocks), tuple(shard_of), num_shards, strategy=self.name)


class BytePSPlacement(PlacementStrategy):
    """BytePS: every tensor cut into fixed-size partitions, each partition's key hashed to a server."""

    name = "byteps"

    def __init__(self, partition_bytes: int = BYTEPS_PARTITION_BYTES):
        if partition_bytes < BYTES_PER_ELEM:
            raise UserInputError(f"partition_bytes must be at least {BYTES_PER_ELEM}, got {partition_bytes}")
        self.partition_bytes = partition_bytes

    def place(self, params: Sequence[ParamInfo], num_shards: int) -> Placement:
        _check_shards(num_shards)
        blocks = split_blocks(params, self.partition_bytes // BYTES_PER_ELEM)
        part = self.partition_bytes // BYTES_PER_ELEM
        shard_of = [djb2(f"{b.name}:{b.start // part}") % num_shards for b in blocks]
        return Placement(tuple(blocks), tuple(shard_of), num_shards, strategy=self.name)


class PsldPlacement(PlacementStrategy):
    """PSLD's initial placement: blocks no larger than a bound, balanced by bytes (largest first).

    The bound is ``max_block_elems`` if given, otherwise about ``1 / (num_shards * blocks_per_shard)``
    of the model (at least ``min_block_elems``), so the live balancer has blocks fine enough to even
    out a slow shard. Block ids stay in model order; only the shard assignment is balanced.
    """

    name = "psld"

    def __init__(self, max_block_elems: int | None = None, *, blocks_per_shard: int = 16,
                 min_block_elems: int = 1024):
        if max_block_elems is not None and max_block_elems < 1:
            raise UserInputError(f"max_block_elems must be positive, got {max_block_elems}")
        if blocks_per_shard < 1 or min_block_elems < 1:
            raise UserInputError("blocks_per_shard and min_block_elems must be positive")
        self.max_block_elems = max_block_elems
        self.blocks_per_shard = blocks_per_shard
        self.min_block_elems = min_block_elems

    def block_bound(self, params: Sequence[ParamInfo], num_shards: int) -> int:
        """The largest block size in elements this strategy will use for ``params``."""
        if self.max_block_elems is not None:
            return self.max_block_elems
        total = sum(p.numel for p in params)
        return max(self.min_block_elems, math.ceil(total / (num_shards * self.blocks_per_shard)))

    def place(self, params: Sequence[ParamInfo], num_shards: int) -> Placement:
        _check_shards(num_shards)
        bound = self.block_bound(params, num_shards)
        blocks = _slices(params, lambda p: _even_sizes(p.numel, math.ceil(max(p.numel, 1) / bound)))
        shard_of = [0] * len(blocks)
        loads = [(0, s) for s in range(num_shards)]
        heapq.heapify(loads)
        for b in sorted(blocks, key=lambda b: (-b.nbytes, b.block_id)):
            load, s = heapq.heappop(loads)
            shard_of[b.block_id] = s
            heapq.heappush(loads, (load + b.nbytes, s))
        return Placement(tuple(blocks), tuple(shard_of), num_shards, strategy=self.name)


for _cls in (GreedyPlacement, MXNetPlacement, BytePSPlacement, PsldPlacement):
    register_placement(_cls.name, _cls)
