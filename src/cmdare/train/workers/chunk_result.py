"""What a worker reports after a chunk of steps (no torch: the coordinator and light stubs share it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ChunkResult"]


@dataclass(frozen=True)
class ChunkResult:
    """What a worker reports after a chunk of steps."""

    worker_id: int
    steps: int
    duration_s: float
    loss: float
    compute_s: float
    comm_s: float
    global_step: int
    staleness: tuple[int, ...]
    done: bool  # the shards refused a push: the target step is reached
    notice: dict[str, Any] | None = None  # a preemption notice arrived: the worker stopped to leave
    shard_wait_s: tuple[float, ...] = ()  # per shard (placement index): send-to-reply time, summed over pushes
    params_finite: bool = True  # the parameters it holds at the end are all finite
    diverged_at: int | None = None  # a non-finite loss met on the parameters of this step: it pushed nothing more
    at_risk: dict[str, Any] | None = None  # a rebalance recommendation (AWS), first reported: it trains on
    overflow_skips: int = 0  # amp-fp16: batches whose gradient overflowed in this chunk (not pushed)
    loss_scale: float | None = None  # amp-fp16: the loss scale at the chunk's end
