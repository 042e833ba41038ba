"""Load measurements of parameter shards and the per-byte / per-block costs derived from them.

A shard reports one :class:`ShardLoad` per measurement window (a few iterations). Its busy time per
push, less fixed overheads, divided by the parameter bytes it holds, is its per-byte cost; the cost
of a block on shard ``s`` is then ``per_byte_s[s] * block.nbytes + block_overhead_s``. Two shards
with the same per-byte cost but different busy times differ in placement (one holds more); a shard
whose per-byte cost is a multiple of the others' is slow (see :mod:`cmdare.ps.psld.detector`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cmdare.ps.placement import Placement

__all__ = ["BlockLoad", "ShardCost", "ShardLoad", "block_costs", "block_loads", "shard_costs"]


@dataclass(frozen=True)
class ShardLoad:
    """What one shard measured over a window of ``window_s`` seconds.

    Attributes:
        shard_id: the shard's index in the placement the window was measured under.
        window_s: wall-clock length of the window.
        pushes: push (gradient in, parameters out) requests served.
        bytes_in: gradient bytes received.
        bytes_out: parameter bytes sent.
        busy_s: time spent serving requests (deserialize, apply, serialize).
        apply_s: part of ``busy_s`` spent in the optimizer update.
        queue_s: total time requests waited in the shard's queue before being served.
        wait_s: total time workers waited on this shard (request sent to reply received); optional.
    """

    shard_id: int
    window_s: float
    pushes: int
    bytes_in: int
    bytes_out: int
    busy_s: float
    apply_s: float
    queue_s: float
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        values = (self.window_s, self.pushes, self.bytes_in, self.bytes_out, self.busy_s, self.apply_s,
                  self.queue_s, self.wait_s)
        if self.shard_id < 0 or any(v < 0 for v in values):
            raise ValueError(f"negative value in {self!r}")

    @classmethod
    def from_stats(cls, stats: object, *, wait_s: float | None = None) -> ShardLoad:
        """Build from a shard's counters (e.g. :class:`cmdare.ps.shard.ShardStats`), duck-typed.

        Uses ``shard_id, window_s, pushes, bytes_in, bytes_out, busy_s`` and, when present,
        ``apply_s`` (default: ``busy_s``), ``queue_s`` and ``wait_s`` (default: 0); a given ``wait_s``
        replaces the counters' own.
        """
        busy = float(stats.busy_s)  # type: ignore[attr-defined]
        wait = float(getattr(stats, "wait_s", 0.0)) if wait_s is None else wait_s
        return cls(int(stats.shard_id), float(stats.window_s), int(stats.pushes),  # type: ignore[attr-defined]
                   int(stats.bytes_in), int(stats.bytes_out), busy,  # type: ignore[attr-defined]
                   float(getattr(stats, "apply_s", busy)), float(getattr(stats, "queue_s", 0.0)), wait)

    @property
    def busy_fraction(self) -> float:
        """Share of the window the shard was busy (1.0: saturated)."""
        return min(1.0, self.busy_s / self.window_s) if self.window_s > 0 else 0.0

    @property
    def time_per_push_s(self) -> float:
        """Mean service time of one push (0 when none was served)."""
        return self.busy_s / self.pushes if self.pushes else 0.0

    @property
    def queue_per_push_s(self) -> float:
        """Mean queueing delay of one push."""
        return self.queue_s / self.pushes if self.pushes else 0.0


@dataclass(frozen=True)
class BlockLoad:
    """What one block cost on its shard over a window.

    A shard serves all its blocks in one request, so a block's ``queue_s`` (queueing delay) and
    ``wait_s`` (time workers waited for its reply) are its shard's; its bytes are its own, and its
    ``apply_s`` is its byte share of the shard's update time (the update is one pass over the shard).
    """

    block_id: int
    shard_id: int
    pushes: int
    bytes_in: int
    bytes_out: int
    apply_s: float
    wait_s: float = 0.0
    queue_s: float = 0.0


@dataclass(frozen=True)
class ShardCost:
    """A shard's cost estimate from one window.

    Attributes:
        shard_id: the shard.
        per_byte_s: seconds per push per held parameter byte, overheads removed (None: holds nothing).
        overhead_s: fixed seconds per push (push overhead plus blocks times block overhead).
        time_per_push_s: measured busy seconds per push.
        held_bytes: parameter bytes the shard holds.
        blocks: number of blocks the shard holds.
        busy_fraction: share of the window the shard was busy.
    """

    shard_id: int
    per_byte_s: float | None
    overhead_s: float
    time_per_push_s: float
    held_bytes: int
    blocks: int
    busy_fraction: float


def shard_costs(loads: Sequence[ShardLoad], placement: Placement, *, push_overhead_s: float = 0.0,
                block_overhead_s: float = 0.0) -> list[ShardCost]:
    """Per-shard cost estimates from one window's loads, in ``loads`` order.

    Args:
        loads: one window's measurements, ``shard_id`` indexing ``placement``'s shards.
        placement: the placement the window was measured under.
        push_overhead_s: fixed cost of one push on a shard that holds anything (e.g. the RPC).
        block_overhead_s: fixed cost per block per push (slicing, bookkeeping).

    Returns:
        One :class:`ShardCost` per load; ``per_byte_s`` is None for a shard that holds no bytes or
        served no pushes.
    """
    held = placement.shard_bytes()
    counts = [0] * placement.num_shards
    for s in placement.shard_of:
        counts[s] += 1
    out = []
    for ld in loads:
        if ld.shard_id >= placement.num_shards:
            raise ValueError(f"load for shard {ld.shard_id} but the placement has {placement.num_shards}")
        n = counts[ld.shard_id]
        overhead = (push_overhead_s if n else 0.0) + block_overhead_s * n
        per_byte = None
        if ld.pushes and held[ld.shard_id]:
            per_byte = max(ld.time_per_push_s - overhead, 0.0) / held[ld.shard_id]
        out.append(ShardCost(ld.shard_id, per_byte, overhead, ld.time_per_push_s, held[ld.shard_id], n,
                             ld.busy_fraction))
    return out


def block_costs(loads: Sequence[ShardLoad], placement: Placement, *, push_overhead_s: float = 0.0,
                block_overhead_s: float = 0.0) -> dict[int, float]:
    """Estimated seconds per push each block costs on its current shard.

    ``cost(block) = per_byte_s[shard] * block.nbytes + block_overhead_s``; blocks on a shard without a
    load entry or with no estimate are left out.
    """
    per_byte = {c.shard_id: c.per_byte_s for c in shard_costs(
        loads, placement, push_overhead_s=push_overhead_s, block_overhead_s=block_overhead_s)}
    out = {}
    for b, s in zip(placement.blocks, placement.shard_of, strict=True):
        c = per_byte.get(s)
        if c is not None:
            out[b.block_id] = c * b.nbytes + block_overhead_s
    return out


def block_loads(load: ShardLoad, placement: Placement) -> list[BlockLoad]:
    """Per-block loads of one shard's window under ``placement`` (see :class:`BlockLoad`)."""
    blocks = placement.blocks_on(load.shard_id)
    held = sum(b.nbytes for b in blocks)
    out = []
    for b in blocks:
        share = b.nbytes / held if held else 0.0
        out.append(BlockLoad(b.block_id, load.shard_id, load.pushes, b.nbytes * load.pushes,
                             round(load.bytes_out * share), load.apply_s * share, load.wait_s, load.queue_s))
    return out
