"""Bottleneck detection and mitigation decisions, as pure functions (no cluster, no clock).

Decide apart from do: :func:`diagnose` turns what a live run measured into a :class:`Diagnosis`
(what limits speed, with the evidence), :func:`decide_mitigation` turns that into a decision value
(:class:`AddShard`, :class:`Rebalance`, :class:`ReplaceWorker` or :class:`NoAction`); the training
coordinator carries the decision out and records detection, action and effect.

Classification, first match wins::

    one shard much busier than the others (>= 85% busy, >= 1.5x the median)  -> straggling_shard
    every shard >= 85% busy and the workers could go faster than measured   -> ps_saturated
    a worker below 75% of its expected speed                                -> slow_worker
    measured below the prediction, every worker slowed alike, shards idle   -> network_latency
      (when the latency is measured it must be high, >= 10 ms, to say so)
    otherwise                                                               -> none

"The workers could go faster" compares the measured cluster speed with the sum of the workers'
expected speeds: a PS that saturates (CM-DARE's P100 cluster flattens at 4-5 workers with one PS)
shows as a gap there even when the performance model already predicted the plateau.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from cmdare.errors import UserInputError

__all__ = [
    "AddShard",
    "BottleneckKind",
    "Diagnosis",
    "Mitigation",
    "NoAction",
    "Rebalance",
    "ReplaceWorker",
    "decide_mitigation",
    "diagnose",
]

#: A speed shortfall below this fraction is noise (the published models' errors are 5-15%).
GAP_TOLERANCE = 0.10
#: A shard busier than this fraction of the time has no headroom left.
BUSY_SATURATED = 0.85
#: A shard this many times busier than the median shard straggles.
STRAGGLER_RATIO = 1.5
#: A worker below this fraction of its expected speed is slow.
SLOW_WORKER_RATIO = 0.75
#: Worker-PS latency (ms) at which the network explains a uniform slowdown (CM-DARE measured
#: 0.3, 15.3 and 30.3 ms settings; 15 ms already costs a visible share of a step).
HIGH_LATENCY_MS = 10.0


class BottleneckKind(StrEnum):
    """What limits the cluster's speed."""

    NONE = "none"
    PS_SATURATED = "ps_saturated"
    STRAGGLING_SHARD = "straggling_shard"
    SLOW_WORKER = "slow_worker"
    NETWORK_LATENCY = "network_latency"


@dataclass(frozen=True)
class Diagnosis:
    """A classified speed gap.

    Attributes:
        kind: the bottleneck.
        gap_fraction: ``1 - measured / predicted`` (negative when faster than predicted).
        evidence: human-readable facts behind the classification.
        shard: the straggling shard's index, for ``straggling_shard``.
        worker: the slow worker's index, for ``slow_worker``.
        shards: number of shards observed.
    """

    kind: BottleneckKind
    gap_fraction: float
    evidence: tuple[str, ...] = ()
    shard: int | None = None
    worker: int | None = None
    shards: int = 0


@dataclass(frozen=True)
class AddShard:
    """Add ``count`` parameter-server shards (and spread the blocks over them)."""

    count: int = 1
    reason: str = ""


@dataclass(frozen=True)
class Rebalance:
    """Move blocks off ``shard`` with the PSLD placement."""

    shard: int
    reason: str = ""


@dataclass(frozen=True)
class ReplaceWorker:
    """Replace worker ``worker`` with a fresh server of the same type."""

    worker: int
    reason: str = ""


@dataclass(frozen=True)
class NoAction:
    """Leave the cluster as it is."""

    reason: str = ""


Mitigation = AddShard | Rebalance | ReplaceWorker | NoAction


def _check(
    measured: float,
    predicted: float,
    busy: Sequence[float],
    worker: Sequence[float],
    expected: Sequence[float],
    latency_ms: float | None,
) -> None:
    if measured < 0 or predicted <= 0:
        raise UserInputError(f"speeds must be positive: measured {measured}, predicted {predicted}")
    if len(worker) != len(expected):
        raise UserInputError(f"{len(worker)} worker speeds but {len(expected)} expected speeds")
    if any(b < 0 or b > 1 for b in busy):
        raise UserInputError("shard busy fractions must be between 0 and 1")
    if any(v < 0 for v in worker) or any(v <= 0 for v in expected):
        raise UserInputError("worker speeds must be non-negative and expected speeds positive")
    if latency_ms is not None and latency_ms < 0:
        raise UserInputError(f"latency must be non-negative, got {latency_ms} ms")


def diagnose(
    measured_steps_per_s: float,
    predicted_steps_per_s: float,
    shard_busy_fraction: Sequence[float],
    worker_steps_per_s: Sequence[float],
    worker_expected_steps_per_s: Sequence[float],
    latency_ms: float | None = None,
) -> Diagnosis:
    """Classify why a live cluster runs at the speed it does.

    Args:
        measured_steps_per_s: global steps/s measured over the last window.
        predicted_steps_per_s: the performance model's prediction for the live membership.
        shard_busy_fraction: per PS shard, the fraction of the window it spent serving requests.
        worker_steps_per_s: per worker, its measured pushes per second.
        worker_expected_steps_per_s: per worker, its expected speed (its GPU's single-worker speed).
        latency_ms: measured worker-PS round-trip latency, if known.

    Returns:
        The diagnosis, with evidence.

    Raises:
        UserInputError: on negative speeds, mismatched lengths or busy fractions outside [0, 1].
    """
    _check(measured_steps_per_s, predicted_steps_per_s, shard_busy_fraction, worker_steps_per_s,
           worker_expected_steps_per_s, latency_ms)
    busy = list(shard_busy_fraction)
    gap = 1.0 - measured_steps_per_s / predicted_steps_per_s
    capacity = sum(worker_expected_steps_per_s)
    headroom = 1.0 - measured_steps_per_s / capacity if capacity else 0.0
    speed_note = (
        f"measured {measured_steps_per_s:.1f} steps/s vs predicted {predicted_steps_per_s:.1f} "
        f"({gap:+.0%} gap) and {capacity:.1f} the workers could do alone"
    )
    n = len(busy)

    if n >= 2:
        top = max(range(n), key=busy.__getitem__)
        median = statistics.median(busy)
        if busy[top] >= BUSY_SATURATED and busy[top] >= STRAGGLER_RATIO * max(median, 1e-9):
            return Diagnosis(
                BottleneckKind.STRAGGLING_SHARD, gap,
                (f"shard {top} busy {busy[top]:.0%} vs median {median:.0%}", speed_note),
                shard=top, shards=n,
            )
    if n and min(busy) >= BUSY_SATURATED and headroom >= GAP_TOLERANCE:
        busy_note = ", ".join(f"{b:.0%}" for b in busy)
        return Diagnosis(
            BottleneckKind.PS_SATURATED, gap,
            (f"all {n} shard(s) busy ({busy_note})", speed_note,
             f"cluster runs {headroom:.0%} below its workers' combined speed"),
            shards=n,
        )
    ratios = [w / e for w, e in zip(worker_steps_per_s, worker_expected_steps_per_s, strict=True)]
    if ratios:
        slow = min(range(len(ratios)), key=ratios.__getitem__)
        if ratios[slow] < SLOW_WORKER_RATIO:
            others = [r for i, r in enumerate(ratios) if i != slow]
            typical = statistics.median(others) if others else 1.0
            return Diagnosis(
                BottleneckKind.SLOW_WORKER, gap,
                (f"worker {slow} at {ratios[slow]:.0%} of its expected speed "
                 f"(others at {typical:.0%})", speed_note),
                worker=slow, shards=n,
            )
    if gap >= GAP_TOLERANCE and (not busy or max(busy) < BUSY_SATURATED):
        uniform = not ratios or max(ratios) - min(ratios) < 0.15
        if uniform and (latency_ms is None or latency_ms >= HIGH_LATENCY_MS):
            lat = "latency not measured" if latency_ms is None else f"latency {latency_ms:.1f} ms"
            return Diagnosis(
                BottleneckKind.NETWORK_LATENCY, gap,
                (speed_note, "every worker slowed alike and no shard is busy", lat),
                shards=n,
            )
    note = "within tolerance" if gap < GAP_TOLERANCE else "gap without a recognised cause"
    return Diagnosis(BottleneckKind.NONE, gap, (speed_note, note), shards=n)


def decide_mitigation(diagnosis: Diagnosis) -> Mitigation:
    """The action for a diagnosis: a saturated PS gets a shard, a straggling shard a PSLD rebalance,
    a slow worker a replacement; latency and no bottleneck get no action (with the reason)."""
    kind = diagnosis.kind
    why = "; ".join(diagnosis.evidence)
    if kind is BottleneckKind.PS_SATURATED:
        return AddShard(1, why)
    if kind is BottleneckKind.STRAGGLING_SHARD and diagnosis.shard is not None:
        return Rebalance(diagnosis.shard, why)
    if kind is BottleneckKind.SLOW_WORKER and diagnosis.worker is not None:
        return ReplaceWorker(diagnosis.worker, why)
    if kind is BottleneckKind.NETWORK_LATENCY:
        return NoAction(f"network latency: place PS and workers in one zone ({why})")
    return NoAction(why)
