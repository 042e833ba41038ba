"""Who decides placement changes during a run: the PSLD balancer, a script, or the user.

Each source turns shard measurements into decision lists (:mod:`cmdare.ps.psld.decisions`); the controller's
parameter-server topology (:mod:`cmdare.control.ps_topology`) owns the run's sources, feeds them the shard loads
the driver measures (``ShardLoads``) and the chunks' times, asks them at each balancing step (or at every pass,
``every_tick``), has the workers quiesced and the driver carry the decisions out (:mod:`cmdare.ps.migration`), and
tells them what was carried out. ``cmdare ps add|remove RUN`` drops a request into the run's storage
(:mod:`cmdare.train.runtime.run_files`); the driver reports it and the topology turns it into decisions with
:func:`decisions_for_request`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cmdare.ps.placement import Placement
from cmdare.ps.psld.decisions import AddShard, Decision, Move, NoChange, RemoveShard


class DecisionSource:
    """Base: sees shard loads, proposes decisions, learns what was carried out.

    The coordinator asks at every ``balance_every`` steps, or at every tick when ``every_tick``.
    """

    every_tick = False

    def observe(self, stats: Sequence[Any], global_step: int) -> None:  # noqa: B027 - optional
        """Shard counters of the window that just ended (``ShardStats``)."""

    def decide(self, global_step: int, placement: Placement) -> list[Decision]:
        return []

    def applied(self, decisions: Sequence[Decision], placement: Placement, moved_bytes: int, pause_s: float) -> None:
        """The decisions that were carried out and the resulting placement."""

    def observe_chunk(self, worker_id: int, steps: int, duration_s: float, compute_s: float) -> None:  # noqa: B027
        """A worker's chunk: its steps, its time and the part of it spent computing (bottleneck detection)."""

    def take_reports(self) -> list[tuple[str, dict[str, Any]]]:
        """What the source saw worth reporting since the last call (``(kind, details)``)."""
        return []

    def drain(self, placement: Placement, shard: int) -> list[Decision] | None:
        """Where the blocks of ``shard`` go when its server leaves (the moves, then its removal); None: this
        source has no plan of its own."""
        return None

    def fill(self, placement: Placement) -> list[Decision] | None:
        """A replacement shard added and the blocks it takes; None: this source has no plan of its own."""
        return None


class PsldSource(DecisionSource):
    """The PSLD balancer (UCB exploration over block moves; elastic shards with ``elastic=True``)."""

    def __init__(self, placement: Placement, elastic: bool = False, interval_steps: int = 50, seed: int = 0,
                 **kwargs: Any):
        from cmdare.ps.psld import PsldBalancer

        self.balancer = PsldBalancer(placement.num_shards, placement, elastic=elastic,
                                     interval_steps=interval_steps, seed=seed, **kwargs)

    def observe(self, stats: Sequence[Any], global_step: int) -> None:
        from cmdare.ps.psld import ShardLoad

        self.balancer.observe([ShardLoad.from_stats(s) for s in stats], global_step)

    def decide(self, global_step: int, placement: Placement) -> list[Decision]:
        return [d for d in self.balancer.decide(global_step) if not isinstance(d, NoChange)]

    def applied(self, decisions: Sequence[Decision], placement: Placement, moved_bytes: int, pause_s: float) -> None:
        if decisions:
            self.balancer.apply(decisions)
        else:
            self.balancer.set_placement(placement)
        self.balancer.observe_migration(moved_bytes, pause_s)

    def add_shard(self) -> list[Decision]:
        return self.balancer.add_shard()

    def remove_shard(self, shard: int) -> list[Decision]:
        return self.balancer.remove_shard(shard)

    def drain(self, placement: Placement, shard: int) -> list[Decision] | None:
        return self.remove_shard(shard)

    def fill(self, placement: Placement) -> list[Decision] | None:
        from cmdare.errors import UserInputError

        try:
            return self.add_shard()
        except UserInputError:  # at the balancer's maximum of shards: the replacement is filled by bytes
            return None


class ScriptedSource(DecisionSource):
    """Decisions given in advance by global step (tests, experiments).

    ``script`` maps a step to a decision list, or to a function of the current placement that
    returns one (so moves can name the blocks where they are at that time).
    """

    every_tick = True

    def __init__(self, script: dict[int, list[Decision] | Callable[[Placement], list[Decision]]]):
        self.script = dict(script)

    def decide(self, global_step: int, placement: Placement) -> list[Decision]:
        due = sorted(s for s in self.script if s <= global_step)
        if not due:
            return []
        item = self.script.pop(due[0])  # one entry per decision point: each sees the placement it changes
        return list(item(placement) if callable(item) else item)


def fill_moves(placement: Placement, new_shard: int) -> list[Decision]:
    """Moves that give a new, empty shard its share of the bytes (largest blocks from the fullest shards)."""
    loads = placement.shard_bytes() + [0] * (new_shard + 1 - placement.num_shards)
    target = sum(loads) / len(loads)
    moves: list[Decision] = []
    for b, s in sorted(zip(placement.blocks, placement.shard_of, strict=True), key=lambda t: -t[0].nbytes):
        if loads[new_shard] + b.nbytes > target * 1.05 or loads[s] - b.nbytes < loads[new_shard]:
            continue
        moves.append(Move(b.block_id, s, new_shard))
        loads[s] -= b.nbytes
        loads[new_shard] += b.nbytes
    return moves


def add_shard_moves(placement: Placement) -> list[Decision]:
    """A new shard, and the moves that give it its share of the bytes (:func:`fill_moves`)."""
    return [AddShard(), *fill_moves(placement, placement.num_shards)]


def drain_moves(placement: Placement, shard: int) -> list[Decision]:
    """Moves that empty ``shard`` onto the least-loaded others."""
    loads = placement.shard_bytes()
    moves: list[Decision] = []
    others = [k for k in range(placement.num_shards) if k != shard]
    for b in sorted(placement.blocks_on(shard), key=lambda b: -b.nbytes):
        dst = min(others, key=lambda k: loads[k])
        moves.append(Move(b.block_id, shard, dst))
        loads[dst] += b.nbytes
    return moves


def evacuation_moves(source: DecisionSource | None, placement: Placement, shard: int) -> list[Decision]:
    """Where a leaving shard's blocks go: the placement sources' plan (PSLD's, where it balances the run), else
    the least-loaded survivors; then the shard is removed."""
    plan = source.drain(placement, shard) if source is not None else None
    return plan if plan is not None else [*drain_moves(placement, shard), RemoveShard(shard)]


def onto_replacement_moves(placement: Placement, shard: int) -> list[Decision]:
    """The last shard's blocks onto its replacement: a shard added, every block moved to it, the old removed."""
    new = placement.num_shards
    return [AddShard(), *(Move(b.block_id, shard, new) for b in placement.blocks_on(shard)), RemoveShard(shard)]


def fill_decisions(source: DecisionSource | None, placement: Placement) -> list[Decision]:
    """A replacement shard added and its share of the blocks: the placement sources' plan (PSLD's), else by
    bytes (:func:`add_shard_moves`)."""
    plan = source.fill(placement) if source is not None else None
    return plan if plan is not None else add_shard_moves(placement)


def decisions_for_request(req: dict[str, Any], placement: Placement) -> list[Decision]:
    """Turn an ``add``/``remove`` request into decisions for the current placement."""
    if req["action"] == "add":
        return add_shard_moves(placement)
    shard = req.get("shard")
    shard = placement.num_shards - 1 if shard is None else int(shard)
    if placement.num_shards <= 1 or not 0 <= shard < placement.num_shards:
        return []
    return [*drain_moves(placement, shard), RemoveShard(shard)]
