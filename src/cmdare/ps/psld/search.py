"""Search over block moves: optimistic (UCB) greedy planning on the cost model.

Why UCB and not epsilon-greedy: every move is a real migration that pauses training, and the
objective (the slowest shard's time) is flat around a balanced placement. Epsilon-greedy keeps
making random moves at rate epsilon forever, which costs migrations and unbalances a balanced
cluster (PSLD must stay within a few percent of the best static placement when nothing is wrong).
UCB explores only where the model is unsure: a destination's per-byte cost is discounted by
``explore * sd * sqrt(ln N)`` (see :meth:`CostModel.optimism`), which is large for a new shard or one
observed a few times and shrinks as windows accumulate, so exploration fades out by itself and the
moves stop once the cluster is balanced. It is also deterministic given the measurements, which
makes decisions reproducible and testable.

The planner is greedy on a lexicographic objective: repeatedly move one block off the currently
slowest shard to the destination that minimises the larger of the two touched shards' predicted
times, as long as both end below the old maximum. Every accepted move strictly decreases the sorted
vector of shard times, so the planner terminates; with ties at the top it walks through all tied
shards. The plan is cut after the move that reached its lowest maximum (later moves only reshuffle
shards that do not bound the iteration time).

Exploration and exploitation split the work: incoming blocks are priced optimistically (UCB), which
decides where blocks go first (toward shards whose cost is uncertain, so the next window measures
them), while the mean estimates decide how far the plan goes (the cut) and whether it is worth its
migration (:attr:`Plan.gain_s` and the balancer's payback check). An optimistic plan that does not
pay in expectation is replaced by the plain exploitation plan (``explore=0``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cmdare.ps.blocks import Block
from cmdare.ps.placement import Placement
from cmdare.ps.psld.cost_model import CostModel
from cmdare.ps.psld.decisions import Move

__all__ = ["Plan", "plan_drain", "plan_rebalance", "predict_after"]


@dataclass(frozen=True)
class Plan:
    """Moves and their predicted effect (seconds per push, mean estimates)."""

    moves: tuple[Move, ...]
    times_before_s: tuple[float, ...]
    times_after_s: tuple[float, ...]
    moved_bytes: int

    @property
    def gain_s(self) -> float:
        """Predicted drop of the slowest shard's time per push."""
        before = max(self.times_before_s, default=0.0)
        return before - max(self.times_after_s, default=0.0)


class _State:
    """Per-shard bytes/blocks during planning; incoming bytes are priced with optimism."""

    def __init__(self, placement: Placement, model: CostModel, explore: float):
        n = placement.num_shards
        self.model = model
        self.base = placement.shard_bytes()
        self.incoming = [0] * n
        self.cnt = [0] * n
        for s in placement.shard_of:
            self.cnt[s] += 1
        self.c = [model.per_byte_s(s) for s in range(n)]
        self.c_in = [self.c[s] * (1.0 - model.optimism(s, explore)) for s in range(n)]
        self.times = [self.time(s, self.base[s], self.incoming[s], self.cnt[s]) for s in range(n)]

    def time(self, s: int, base: int, incoming: int, cnt: int, *, mean: bool = False) -> float:
        if cnt == 0:
            return 0.0
        m = self.model
        c_in = self.c[s] if mean else self.c_in[s]
        return m.push_overhead_s + m.block_overhead_s * cnt + self.c[s] * base + c_in * incoming

    def mean_max(self) -> float:
        return max((self.time(s, self.base[s], self.incoming[s], self.cnt[s], mean=True)
                    for s in range(len(self.cnt))), default=0.0)

    def after_out(self, s: int, b: Block, moved_in: bool) -> float:
        base, inc = (self.base[s], self.incoming[s] - b.nbytes) if moved_in else \
            (self.base[s] - b.nbytes, self.incoming[s])
        return self.time(s, base, inc, self.cnt[s] - 1)

    def after_in(self, d: int, b: Block) -> float:
        return self.time(d, self.base[d], self.incoming[d] + b.nbytes, self.cnt[d] + 1)

    def apply(self, s: int, d: int, b: Block, moved_in: bool) -> None:
        self.times[s] = self.after_out(s, b, moved_in)
        self.times[d] = self.after_in(d, b)
        if moved_in:
            self.incoming[s] -= b.nbytes
        else:
            self.base[s] -= b.nbytes
        self.cnt[s] -= 1
        self.incoming[d] += b.nbytes
        self.cnt[d] += 1


def predict_after(placement: Placement, model: CostModel, moves: Iterable[Move],
                  num_shards: int | None = None) -> list[float]:
    """Mean-estimate seconds per push of every shard after ``moves`` (``num_shards`` may add shards)."""
    moves = list(moves)
    n = num_shards or placement.num_shards
    grown = Placement(placement.blocks, placement.shard_of, n)
    return model.predict(grown.moved({m.block_id: m.dst for m in moves}) if moves else grown)


def plan_rebalance(placement: Placement, model: CostModel, *, explore: float = 0.0,
                   destinations: Sequence[int] | None = None, max_plan_moves: int | None = None) -> Plan:
    """Greedy optimistic plan of block moves that lowers the slowest shard's predicted time.

    Args:
        placement: the current placement (it may include new, empty shards to fill).
        model: the cost model.
        explore: UCB coefficient (0: pure exploitation).
        destinations: shards allowed to receive blocks (default: all).
        max_plan_moves: cap on the plan's length (default: twice the number of blocks).

    Returns:
        The plan cut where the mean estimates predict its lowest maximum; empty when no move helps.
    """
    st = _State(placement, model, explore)
    n = placement.num_shards
    dests = list(range(n)) if destinations is None else list(destinations)
    on: list[list[Block]] = [[] for _ in range(n)]
    for b, s in zip(placement.blocks, placement.shard_of, strict=True):
        on[s].append(b)
    moved: set[int] = set()
    cap = 2 * len(placement.blocks) if max_plan_moves is None else max_plan_moves
    moves: list[Move] = []
    best_max, best_len = st.mean_max(), 0
    while len(moves) < cap:
        m = max(range(n), key=lambda s: (st.times[s], -s))
        top = st.times[m]
        best = None
        for b in on[m]:
            if b.block_id in moved:
                continue
            new_m = st.after_out(m, b, False)
            for d in dests:
                if d == m:
                    continue
                new_d = st.after_in(d, b)
                if new_d >= top or new_m >= top:
                    continue
                key = (max(new_m, new_d), b.nbytes, b.block_id, d)
                if best is None or key < best[0]:
                    best = (key, b, d)
        if best is None:
            break
        _, b, d = best
        st.apply(m, d, b, False)
        on[m].remove(b)
        on[d].append(b)
        moved.add(b.block_id)
        moves.append(Move(b.block_id, m, d))
        if st.mean_max() < best_max * (1 - 1e-9):
            best_max, best_len = st.mean_max(), len(moves)
    return _plan(placement, model, moves[:best_len])


def plan_drain(placement: Placement, model: CostModel, shard: int) -> Plan:
    """Moves that empty ``shard``: its blocks, largest first, each to the shard it slows least."""
    st = _State(placement, model, 0.0)
    dests = [s for s in range(placement.num_shards) if s != shard]
    if not dests:
        return _plan(placement, model, [])
    moves = []
    for b in sorted(placement.blocks_on(shard), key=lambda b: (-b.nbytes, b.block_id)):
        d = min(dests, key=lambda d: (st.after_in(d, b), d))
        st.apply(shard, d, b, False)
        moves.append(Move(b.block_id, shard, d))
    return _plan(placement, model, moves)


def _plan(placement: Placement, model: CostModel, moves: list[Move]) -> Plan:
    size = {b.block_id: b.nbytes for b in placement.blocks}
    before = model.predict(placement)
    after = predict_after(placement, model, moves) if moves else before
    return Plan(tuple(moves), tuple(before), tuple(after), sum(size[m.block_id] for m in moves))
