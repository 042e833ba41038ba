"""Decision values the PSLD balancer returns, and how a placement changes when they are carried out.

The balancer decides; the parameter-server controller does. A decision list is executed in order:

- ``Move(block_id, src, dst)``: migrate one block at an iteration boundary.
- ``AddShard()``: start one more shard; it gets the next index (``num_shards``) and holds nothing
  until the ``Move`` decisions that follow it fill it.
- ``RemoveShard(shard_id)``: stop a shard that the preceding ``Move`` decisions emptied. Shard
  indices stay compact: every shard above ``shard_id`` moves down by one.
- ``NoChange(reason)``: nothing to do; ``reason`` says why (for logs and tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cmdare.errors import UserInputError
from cmdare.ps.placement import Placement

__all__ = ["AddShard", "Decision", "Move", "NoChange", "RemoveShard", "apply_decisions", "moved_bytes"]


@dataclass(frozen=True)
class Move:
    """Migrate block ``block_id`` from shard ``src`` to shard ``dst``."""

    block_id: int
    src: int
    dst: int


@dataclass(frozen=True)
class AddShard:
    """Start one more shard (index ``num_shards`` before the addition)."""


@dataclass(frozen=True)
class RemoveShard:
    """Stop shard ``shard_id``; it must be empty by then. Higher shard indices shift down by one."""

    shard_id: int


@dataclass(frozen=True)
class NoChange:
    """Leave the placement as it is, because of ``reason``."""

    reason: str


Decision = Move | AddShard | RemoveShard | NoChange


def moved_bytes(placement: Placement, decisions: Sequence[Decision]) -> int:
    """Bytes of parameters the ``Move`` decisions migrate (optimizer state not counted)."""
    size = {b.block_id: b.nbytes for b in placement.blocks}
    return sum(size[d.block_id] for d in decisions if isinstance(d, Move))


def apply_decisions(placement: Placement, decisions: Sequence[Decision]) -> Placement:
    """The placement after carrying out ``decisions`` in order (one version bump for the lot).

    Raises:
        ValueError: a ``Move`` names the wrong source or a shard out of range (a stale decision),
            or a ``RemoveShard`` targets a shard that still holds blocks.
        UserInputError: the decisions would remove the last shard.
    """
    if all(isinstance(d, NoChange) for d in decisions):
        return placement
    shard_of = {b.block_id: s for b, s in zip(placement.blocks, placement.shard_of, strict=True)}
    num_shards = placement.num_shards
    for d in decisions:
        if isinstance(d, Move):
            if d.block_id not in shard_of:
                raise ValueError(f"unknown block {d.block_id}")
            if shard_of[d.block_id] != d.src:
                raise ValueError(f"block {d.block_id} is on shard {shard_of[d.block_id]}, not {d.src}")
            if not 0 <= d.dst < num_shards:
                raise ValueError(f"destination shard {d.dst} out of range for {num_shards} shards")
            shard_of[d.block_id] = d.dst
        elif isinstance(d, AddShard):
            num_shards += 1
        elif isinstance(d, RemoveShard):
            if not 0 <= d.shard_id < num_shards:
                raise ValueError(f"shard {d.shard_id} out of range for {num_shards} shards")
            if num_shards == 1:
                raise UserInputError("cannot remove the last parameter shard")
            left = [b for b, s in shard_of.items() if s == d.shard_id]
            if left:
                raise ValueError(f"shard {d.shard_id} still holds {len(left)} blocks; move them first")
            shard_of = {b: (s - 1 if s > d.shard_id else s) for b, s in shard_of.items()}
            num_shards -= 1
    old = zip(placement.blocks, placement.shard_of, strict=True)
    changes = {b.block_id: shard_of[b.block_id] for b, s in old if shard_of[b.block_id] != s}
    return placement.moved(changes, num_shards=num_shards)
