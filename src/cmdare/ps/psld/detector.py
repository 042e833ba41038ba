"""Straggler detection: tell a slow shard from a heavy placement.

Both make a shard the slowest, but they need different cures. A **slow** shard costs more per byte
than its peers (a 3x slowed server shows about 3x the median per-byte cost): it should hold fewer
bytes than the others, and its cost estimate, not its byte count, says how many. A **heavy** shard
has a normal per-byte cost but holds more bytes than its share, so its time per push is above the
mean: evening out bytes cures it. A slow shard that is also the bottleneck (``slow+heavy``, e.g. a
slowed server under a byte-balanced placement) needs bytes moved off in proportion to its speed; a
slow shard whose time is back to the mean (``slow``) has been compensated already.
**Idle** shards are busy for only a small share of the window (scale-in when all are idle).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from cmdare.ps.psld.load import ShardCost

__all__ = ["ShardDiagnosis", "ShardState", "diagnose"]


class ShardState(StrEnum):
    OK = "ok"
    SLOW = "slow"  # per-byte cost well above its peers'
    HEAVY = "heavy"  # normal per-byte cost, time per push well above the mean: too many bytes
    SLOW_AND_HEAVY = "slow+heavy"  # slow and still the bottleneck: it holds too many bytes for its speed
    IDLE = "idle"  # busy for only a small share of the window
    EMPTY = "empty"  # holds no bytes


@dataclass(frozen=True)
class ShardDiagnosis:
    """One shard's state and the ratios behind it (1.0: like its peers)."""

    shard_id: int
    state: ShardState
    per_byte_ratio: float  # per-byte cost / median per-byte cost of the other shards
    load_ratio: float  # time per push / mean time per push of all non-empty shards
    busy_fraction: float


def diagnose(costs: Sequence[ShardCost], *, slow_ratio: float = 1.5, heavy_ratio: float = 1.15,
             idle_busy: float = 0.3, per_byte_s: Sequence[float] | None = None) -> list[ShardDiagnosis]:
    """Classify every shard of one window.

    Args:
        costs: :func:`~cmdare.ps.psld.load.shard_costs` of the window.
        slow_ratio: per-byte cost ratio (vs the median of the others) from which a shard is slow.
        heavy_ratio: time-per-push ratio (vs the mean) from which a shard is heavy.
        idle_busy: busy fraction below which a shard is idle.
        per_byte_s: smoothed per-byte costs by shard id (e.g. from the cost model) to use instead
            of the single window's estimates.

    Returns:
        One diagnosis per entry of ``costs``, in the same order.
    """
    pb = {c.shard_id: (per_byte_s[c.shard_id] if per_byte_s is not None else c.per_byte_s)
          for c in costs if c.per_byte_s is not None}
    times = [c.time_per_push_s for c in costs if c.held_bytes > 0]
    mean_t = statistics.fmean(times) if times else 0.0
    out = []
    for c in costs:
        others = [v for s, v in pb.items() if s != c.shard_id]
        ref = statistics.median(others) if others else None
        ratio = pb[c.shard_id] / ref if c.shard_id in pb and ref else 1.0
        load = c.time_per_push_s / mean_t if mean_t > 0 and c.held_bytes > 0 else 0.0
        slow, heavy = ratio >= slow_ratio, load >= heavy_ratio
        if c.held_bytes == 0:
            state = ShardState.EMPTY
        elif slow and heavy:
            state = ShardState.SLOW_AND_HEAVY
        elif slow:
            state = ShardState.SLOW
        elif heavy:
            state = ShardState.HEAVY
        elif c.busy_fraction < idle_busy:
            state = ShardState.IDLE
        else:
            state = ShardState.OK
        out.append(ShardDiagnosis(c.shard_id, state, ratio, load, c.busy_fraction))
    return out

