"""Placement changes while training: ``cmdare ps add|remove`` requests and the balancers' decisions,
carried out on quiesced shards and reported as ``ps_move`` / ``ps_add`` / ``ps_remove`` events."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cmdare.ps.migration import MigrationResult
from cmdare.ps.psld.decisions import Decision
from cmdare.storage import Storage
from cmdare.train.ps.balancing import DecisionSource, decisions_for_request
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.run.emitter import RunEmitter
from cmdare.train.run.run_files import read_requests, write_status

__all__ = ["PlacementChanges"]

REMOTE_REQUEST_POLL_S = 2.0  # an object store is asked for ``cmdare ps`` requests at most this often


class PlacementChanges:
    """Who changes the placement (``decisions``) and the executor of their changes."""

    def __init__(self, shards: ShardGroup, decisions: DecisionSource | None, emitter: RunEmitter,
                 storage: Storage):
        self.shards, self.decisions, self.emitter, self.storage = shards, decisions, emitter, storage
        self.migrations = 0
        self._poll_every_s = 0.0 if storage.is_local else REMOTE_REQUEST_POLL_S
        self._next_poll = 0.0

    def collect_stats(self, global_step: int) -> list[Any] | None:
        """The shards' load since the last collection, shown to the balancers; None when a shard died."""
        stats = self.shards.collect_stats(global_step)
        if stats is not None and self.decisions is not None:
            self.decisions.observe(stats, global_step)
        return stats

    def poll(self, global_step: int, balance_due: bool) -> list[Decision]:
        """Placement changes to make now: queued ``cmdare ps`` requests, then the balancers'."""
        placement = self.shards.placement
        assert placement is not None
        planned: list[Decision] = []
        if time.monotonic() >= self._next_poll:
            self._next_poll = time.monotonic() + self._poll_every_s
            for req in read_requests(self.storage):
                planned.extend(decisions_for_request(req, placement))
        if not planned and self.decisions is not None and (balance_due or self.decisions.every_tick):
            if balance_due:
                self.collect_stats(global_step)  # closes the current load window (the balancer observes it)
            planned = self.decisions.decide(global_step, self.shards.placement)
        return planned

    def observe_chunk(self, worker_id: int, steps: int, duration_s: float, compute_s: float) -> None:
        """A worker's chunk, for the balancers that watch worker speed (bottleneck detection)."""
        if steps and self.decisions is not None and hasattr(self.decisions, "observe_chunk"):
            self.decisions.observe_chunk(worker_id, steps, duration_s, compute_s)

    def migrate(self, decisions: list[Decision], workers: Sequence[Any], global_step: int,
                removed_reason: str = "removed") -> tuple[MigrationResult, float]:
        """Carry out placement changes on quiesced shards and report them; returns the result and pause."""
        old_n = len(self.shards.shards)
        result, pause_s = self.shards.migrate(decisions, workers, removed_reason)
        placement = self.shards.placement
        if self.decisions is not None:
            self.decisions.applied(result.done, placement, result.moved_bytes, pause_s)
        moves = [d for d in result.done if type(d).__name__ == "Move"]
        self.migrations += len(moves)
        n = len(self.shards.shards)
        kind = "ps_add" if n > old_n else "ps_remove" if n < old_n else "ps_move"
        self.emitter.event(kind, details={"moves": len(moves), "moved_bytes": result.moved_bytes, "pause_s": pause_s,
                                          "num_shards": n, "rolled_back": result.rolled_back, "error": result.error,
                                          "placement_version": placement.version})
        write_status(self.storage, "running", n, global_step)
        return result, pause_s
