"""Placement changes while training: the controller's decisions (a balancer's, a ``cmdare ps add|remove``
request's), carried out on quiesced shards and reported as ``ps_move`` / ``ps_add`` / ``ps_remove`` events."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from cmdare.control import run_events as E
from cmdare.ps.migration import MigrationResult
from cmdare.ps.psld.decisions import Decision, Move
from cmdare.storage import Storage
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.runtime.run_files import read_requests, write_status

__all__ = ["PlacementChanges"]

REMOTE_REQUEST_POLL_S = 2.0  # an object store is asked for ``cmdare ps`` requests at most this often


class PlacementChanges:
    """The executor of placement changes: the shards' load measured, ``cmdare ps`` requests read, block moves
    carried out and reported. Who decides them is the controller's (:mod:`cmdare.control.balancers`)."""

    def __init__(self, shards: ShardGroup, emitter: RunEmitter, storage: Storage):
        self.shards, self.emitter, self.storage = shards, emitter, storage
        self.migrations = 0
        self._done: list[tuple[tuple[Decision, ...], int, float]] = []  # carried out, not yet reported
        self._poll_every_s = 0.0 if storage.is_local else REMOTE_REQUEST_POLL_S
        self._next_poll = 0.0

    def collect_stats(self, global_step: int) -> list[Any] | None:
        """The shards' load since the last collection; None when a shard died."""
        return self.shards.collect_stats(global_step)

    def loads(self, wall: float, step: float, dead_keys: Callable[[], tuple[int, ...]],
              balance: bool = False) -> list[E.Event]:
        """The shards' load since the last measurement, with the placement, for the controller (``balance``: the
        answer to its ``Balance``); a dead shard: ``ShardLost`` with the keys ``dead_keys()`` names."""
        stats = self.collect_stats(int(step))
        if stats is None:
            lost: list[E.Event] = [E.ShardLost(wall=wall, keys=dead_keys())]
            return [*lost, E.ShardLoads(wall=wall, global_step=step, balance=True)] if balance else lost
        return [E.ShardLoads(wall=wall, global_step=step, stats=tuple(stats), placement=self.shards.placement,
                             balance=balance)]

    def with_moves(self, ev: E.Event) -> E.Event:
        """An action's end, with the block moves it carried out and the placement afterwards (the controller's
        placement sources learn from them); any other event as it is."""
        if not isinstance(ev, E.ActionDone):
            return ev
        return dataclasses.replace(ev, migrations=tuple(self.take_migrations()), placement=self.shards.placement)

    def requests(self) -> list[dict[str, Any]]:
        """``cmdare ps add|remove`` requests queued in the run's storage since the last call (an object store is
        asked at most every :data:`REMOTE_REQUEST_POLL_S`)."""
        if time.monotonic() < self._next_poll:
            return []
        self._next_poll = time.monotonic() + self._poll_every_s
        return list(read_requests(self.storage))

    def take_migrations(self) -> list[tuple[tuple[Decision, ...], int, float]]:
        """The block moves carried out since the last call: ``(decisions done, bytes moved, pause seconds)``."""
        done, self._done = self._done, []
        return done

    def migrate(self, decisions: list[Decision], workers: Sequence[Any], global_step: int,
                removed_reason: str = "removed") -> tuple[MigrationResult, float]:
        """Carry out placement changes on quiesced shards and report them; returns the result and pause."""
        old_n = len(self.shards.shards)
        result, pause_s = self.shards.migrate(decisions, workers, removed_reason)
        placement = self.shards.placement
        self._done.append((tuple(result.done), int(result.moved_bytes), float(pause_s)))
        moves = [d for d in result.done if isinstance(d, Move)]
        self.migrations += len(moves)
        n = len(self.shards.shards)
        kind = "ps_add" if n > old_n else "ps_remove" if n < old_n else "ps_move"
        self.emitter.event(kind, details={"moves": len(moves), "moved_bytes": result.moved_bytes, "pause_s": pause_s,
                                          "num_shards": n, "rolled_back": result.rolled_back, "error": result.error,
                                          "placement_version": placement.version})
        write_status(self.storage, "running", n, global_step)
        return result, pause_s
