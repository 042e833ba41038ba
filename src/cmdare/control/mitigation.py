"""Live bottleneck detection and mitigation (CM-DARE's overloaded-PS use case).

At each balancing point the watch compares the measured cluster speed with the speed the live
workers would reach if the parameter servers and network were free (each worker's compute-only
rate, measured in the same window: for an emulated local run this is the honest prediction; the
planner's models predict it for cloud GPUs). :func:`cmdare.control.bottleneck.diagnose` classifies the
gap (PS saturated, straggling shard, slow worker, network); :func:`decide_mitigation` picks an
action; with ``auto`` the watch turns it into placement decisions the controller has carried out
(add a shard and fill it, or move load off a straggling shard). Detection, action and effect are
kept in :attr:`BottleneckWatch.reports` (``bottleneck`` and ``mitigation``), which the controller hands on as
``Note`` commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cmdare.control.balancers import DecisionSource, PsldSource, add_shard_moves
from cmdare.control.bottleneck import AddShard as AddShardAction
from cmdare.control.bottleneck import Rebalance, decide_mitigation, diagnose
from cmdare.ps.placement import Placement
from cmdare.ps.psld.decisions import Decision, Move

__all__ = ["MAX_SHARDS", "BottleneckWatch", "CompositeSource", "placement_sources"]

MAX_SHARDS = 8  # the most shards a mitigation adds up to


class BottleneckWatch(DecisionSource):
    """Detects what limits speed; mitigates when ``auto`` (else only reports)."""

    def __init__(self, auto: bool = False, max_shards: int = MAX_SHARDS):
        self.auto, self.max_shards = auto, max_shards
        self.reports: list[tuple[str, dict[str, Any]]] = []  # (kind, details) not handed on yet
        self.busy: list[float] = []
        self._shard_win: list[list[float]] = []  # shard -> [busy_s, window_s] since the last decision
        self._win: dict[int, list[float]] = {}  # worker -> [steps, duration_s, compute_s]
        self._pending_effect: dict[str, Any] | None = None

    def observe(self, stats: Sequence[Any], global_step: int) -> None:
        if len(self._shard_win) != len(stats):  # the shard set changed: start a new window
            self._shard_win = [[0.0, 0.0] for _ in stats]
        for acc, st in zip(self._shard_win, stats, strict=True):
            acc[0] += st.busy_s
            acc[1] += st.window_s

    def observe_chunk(self, worker_id: int, steps: int, duration_s: float, compute_s: float) -> None:
        w = self._win.setdefault(worker_id, [0.0, 0.0, 0.0])
        w[0] += steps
        w[1] += duration_s
        w[2] += compute_s

    def emit(self, kind: str, details: dict[str, Any]) -> None:
        self.reports.append((kind, details))

    def take_reports(self) -> list[tuple[str, dict[str, Any]]]:
        reports, self.reports = self.reports, []
        return reports

    def decide(self, global_step: int, placement: Placement) -> list[Decision]:
        win = {k: v for k, v in self._win.items() if v[0] > 0 and v[1] > 0 and v[2] > 0}
        self._win = {}
        self.busy = [min(1.0, b / w) if w > 0 else 0.0 for b, w in self._shard_win]
        self._shard_win = []
        if not win or not self.busy:
            return []
        measured = [v[0] / v[1] for v in win.values()]
        expected = [v[0] / v[2] for v in win.values()]
        cluster = sum(measured)
        if self._pending_effect is not None:
            before = self._pending_effect["steps_per_s_before"]
            self.emit("mitigation", dict(self._pending_effect, phase="effect", steps_per_s_after=cluster,
                                         speedup=cluster / before if before else None))
            self._pending_effect = None
        d = diagnose(cluster, sum(expected), self.busy, measured, expected)
        if d.kind == "none":
            return []
        evidence = {"diagnosis": str(d.kind), "steps_per_s": cluster, "predicted_steps_per_s": sum(expected),
                    "shard_busy": self.busy, "reason": getattr(d, "reason", "") or str(d)}
        self.emit("bottleneck", evidence)
        action = decide_mitigation(d)
        decisions: list[Decision] = []
        if self.auto and isinstance(action, AddShardAction) and placement.num_shards < self.max_shards:
            decisions = add_shard_moves(placement)
        elif self.auto and isinstance(action, Rebalance) and placement.num_shards > 1:
            decisions = _unload(placement, action.shard)
        name = type(action).__name__
        self.emit("mitigation", {"phase": "action" if decisions else "recommendation", "action": name,
                                 "auto": self.auto, "steps_per_s_before": cluster, "diagnosis": str(d.kind)})
        if decisions:
            self._pending_effect = {"action": name, "steps_per_s_before": cluster, "diagnosis": str(d.kind)}
        return decisions


def _unload(placement: Placement, shard: int) -> list[Decision]:
    """Moves that take half of ``shard``'s bytes to the least-loaded other shards."""
    loads = placement.shard_bytes()
    goal = loads[shard] / 2
    moved, out = 0, []
    others = [k for k in range(placement.num_shards) if k != shard]
    for b in sorted(placement.blocks_on(shard), key=lambda b: -b.nbytes):
        if moved + b.nbytes > goal and moved:
            continue
        dst = min(others, key=lambda k: loads[k])
        out.append(Move(b.block_id, shard, dst))
        loads[dst] += b.nbytes
        moved += b.nbytes
    return out


class CompositeSource(DecisionSource):
    """Several sources in turn: the first with decisions wins this point; all observe everything."""

    def __init__(self, sources: Sequence[DecisionSource]):
        self.sources = list(sources)
        self.every_tick = any(s.every_tick for s in self.sources)

    def observe(self, stats: Sequence[Any], global_step: int) -> None:
        for s in self.sources:
            s.observe(stats, global_step)

    def observe_chunk(self, worker_id: int, steps: int, duration_s: float, compute_s: float) -> None:
        for s in self.sources:
            s.observe_chunk(worker_id, steps, duration_s, compute_s)

    def decide(self, global_step: int, placement: Placement) -> list[Decision]:
        for s in self.sources:
            out = s.decide(global_step, placement)
            if out:
                return out
        return []

    def applied(self, decisions: Sequence[Decision], placement: Placement, moved_bytes: int, pause_s: float) -> None:
        for s in self.sources:
            s.applied(decisions, placement, moved_bytes, pause_s)

    def take_reports(self) -> list[tuple[str, dict[str, Any]]]:
        return [r for s in self.sources for r in s.take_reports()]

    def drain(self, placement: Placement, shard: int) -> list[Decision] | None:
        return next((p for s in self.sources if (p := s.drain(placement, shard)) is not None), None)

    def fill(self, placement: Placement) -> list[Decision] | None:
        return next((p for s in self.sources if (p := s.fill(placement)) is not None), None)


def placement_sources(placement: Placement, *, psld: bool = False, elastic: bool = False, balance_every: int = 50,
                      seed: int = 0, auto_mitigate: bool = False) -> CompositeSource:
    """A run's placement-change sources: PSLD's balancer with ``--placement psld`` (``elastic``: it may add and
    remove shards), then the bottleneck watch (which acts with ``--auto-mitigate``)."""
    sources: list[DecisionSource] = []
    if psld:
        sources.append(PsldSource(placement, elastic=elastic, interval_steps=balance_every, seed=seed))
    sources.append(BottleneckWatch(auto=auto_mitigate))
    return CompositeSource(sources)
