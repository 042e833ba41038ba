"""Carrying out placement decisions on live shards: block moves, added and removed shards.

Runs at an iteration boundary (the coordinator has quiesced the workers: no push is in flight), so
no update can be lost or applied twice. A move takes the blocks with their momentum out of the
source and inserts them into the destination. If the destination dies before it holds them, the
blocks go back to the source and the rest of the plan is abandoned (rolled back); training then
continues on the previous placement.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cmdare.errors import ShardLostError
from cmdare.ps.placement import Placement
from cmdare.ps.psld.decisions import AddShard, Decision, Move, NoChange, RemoveShard, apply_decisions


@dataclass
class MigrationResult:
    """What a migration did: the new shards and placement, the bytes moved, the pause it cost."""

    shards: list[Any]
    placement: Placement
    done: list[Decision]
    moved_bytes: int
    pause_s: float
    rolled_back: bool = False
    error: str = ""
    removed: list[Any] = field(default_factory=list)  # shard actors to stop


def execute(decisions: Sequence[Decision], shards: Sequence[Any], placement: Placement,
            new_shard: Callable[[int], Any]) -> MigrationResult:
    """Carry out ``decisions`` in order on the shard actors; roll back on a destination failure."""
    import ray

    t0 = time.perf_counter()
    shards = list(shards)
    done: list[Decision] = []
    moved = 0
    size = {b.block_id: b.nbytes for b in placement.blocks}
    i = 0
    decisions = [d for d in decisions if not isinstance(d, NoChange)]
    try:
        while i < len(decisions):
            d = decisions[i]
            if isinstance(d, AddShard):
                shards.append(new_shard(len(shards)))
                done.append(d)
                i += 1
            elif isinstance(d, RemoveShard):
                done.append(d)
                i += 1
            else:  # a run of moves between the same pair of shards goes in one take/add
                group = [d]
                while (i + len(group) < len(decisions) and isinstance(decisions[i + len(group)], Move)
                       and (decisions[i + len(group)].src, decisions[i + len(group)].dst) == (d.src, d.dst)):
                    group.append(decisions[i + len(group)])
                data = ray.get(shards[d.src].take.remote([m.block_id for m in group]))
                try:
                    ray.get(shards[d.dst].add.remote(data))
                except ray.exceptions.RayActorError:
                    ray.get(shards[d.src].add.remote(data))  # give the blocks back: nothing lost
                    raise
                done.extend(group)
                moved += sum(size[m.block_id] for m in group)
                i += len(group)
    except ray.exceptions.RayActorError as err:
        return _rollback(shards, placement, done, moved, t0, err)
    new_placement = apply_decisions(placement, done)
    removed = []
    for d in done:  # shard indices shift down after each removal, as in apply_decisions
        if isinstance(d, RemoveShard):
            removed.append(shards.pop(d.shard_id))
    return MigrationResult(shards, new_placement, done, moved, time.perf_counter() - t0, removed=removed)


def _rollback(shards: list[Any], placement: Placement, done: list[Decision], moved: int, t0: float,
              err: Exception) -> MigrationResult:
    """Undo completed moves (newest first) and drop shards added by this plan."""
    import ray

    n_old = placement.num_shards
    for d in reversed([d for d in done if isinstance(d, Move)]):
        try:
            data = ray.get(shards[d.dst].take.remote([d.block_id]))
            ray.get(shards[d.src].add.remote(data))
        except ray.exceptions.RayActorError as lost:
            raise ShardLostError(d.dst, f"died holding block {d.block_id} during a migration") from lost
    for extra in shards[n_old:]:
        with contextlib.suppress(Exception):
            ray.kill(extra)
    return MigrationResult(shards[:n_old], placement, [], 0, time.perf_counter() - t0, rolled_back=True,
                           error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
