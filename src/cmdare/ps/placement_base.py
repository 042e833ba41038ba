"""The placement value, the strategy base class and the strategy table.

Shared by :mod:`cmdare.ps.placement` (the lookup users call) and :mod:`cmdare.ps.strategies` (the
strategies that register here), so neither imports the other's half. Users import these names
from :mod:`cmdare.ps.placement`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cmdare.errors import UserInputError
from cmdare.ps.blocks import Block, ParamInfo, split_blocks

__all__ = ["DEFAULT_PLACEMENT", "PLACEMENTS", "Placement", "PlacementStrategy", "RoundRobin", "register_placement"]


@dataclass(frozen=True)
class Placement:
    """Blocks and the shard each one lives on. ``version`` grows with every migration."""

    blocks: tuple[Block, ...]
    shard_of: tuple[int, ...]  # shard_of[i] is the shard of blocks[i]
    num_shards: int
    version: int = 0
    strategy: str = ""
    _by_id: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.blocks) != len(self.shard_of):
            raise ValueError("blocks and shard_of differ in length")
        if self.num_shards < 1:
            raise UserInputError("a placement needs at least one shard")
        bad = [s for s in self.shard_of if not 0 <= s < self.num_shards]
        if bad:
            raise ValueError(f"shard index {bad[0]} out of range for {self.num_shards} shards")
        object.__setattr__(self, "_by_id", {b.block_id: i for i, b in enumerate(self.blocks)})

    def blocks_on(self, shard: int) -> list[Block]:
        """The blocks held by ``shard``, in block-id order (the shard buffer's order)."""
        return sorted((b for b, s in zip(self.blocks, self.shard_of, strict=True) if s == shard),
                      key=lambda b: b.block_id)

    def shard_of_block(self, block_id: int) -> int:
        return self.shard_of[self._by_id[block_id]]

    def shard_bytes(self) -> list[int]:
        """Bytes of parameters held by each shard."""
        out = [0] * self.num_shards
        for b, s in zip(self.blocks, self.shard_of, strict=True):
            out[s] += b.nbytes
        return out

    def moved(self, moves: dict[int, int], num_shards: int | None = None) -> Placement:
        """A new placement with ``{block_id: new_shard}`` applied and the version bumped."""
        shard_of = list(self.shard_of)
        for block_id, dest in moves.items():
            shard_of[self._by_id[block_id]] = dest
        return Placement(self.blocks, tuple(shard_of), num_shards or self.num_shards,
                         self.version + 1, self.strategy)


class PlacementStrategy(ABC):
    """Maps a model's parameters to shards (and may slice large tensors into blocks)."""

    name: str = ""

    @abstractmethod
    def place(self, params: Sequence[ParamInfo], num_shards: int) -> Placement:
        """Return the placement of ``params`` over ``num_shards`` shards."""


class RoundRobin(PlacementStrategy):
    """TensorFlow's default: whole tensors assigned to shards in turn, in model order."""

    name = "round-robin"

    def place(self, params: Sequence[ParamInfo], num_shards: int) -> Placement:
        blocks = split_blocks(params)
        return Placement(tuple(blocks), tuple(i % num_shards for i in range(len(blocks))), num_shards,
                         strategy=self.name)


PLACEMENTS: dict[str, Callable[[], PlacementStrategy]] = {RoundRobin.name: RoundRobin}
DEFAULT_PLACEMENT = RoundRobin.name


def register_placement(name: str, factory: Callable[[], PlacementStrategy]) -> None:
    """Register a placement strategy under ``name``."""
    PLACEMENTS[name] = factory
