"""An online cost model: each shard's per-push time under a candidate placement, with uncertainty.

For shard ``s`` holding ``B`` parameter bytes in ``n`` blocks, one push costs

    t_s = push_overhead_s * [n > 0] + block_overhead_s * n + per_byte_s[s] * B

``per_byte_s[s]`` is learned from every measurement window as an exponentially weighted ratio
estimator, EWMA(time per push - overheads) / EWMA(held bytes): a window in which the shard held more
bytes weighs more, so a shard that holds little does not get a noisy estimate. The fixed
``push_overhead_s`` starts from a hint and, with ``learn_overhead``, is re-fitted as the median
intercept of per-shard least-squares lines through recent (held bytes, time per push) points, from
shards whose bytes changed enough (a migration or a scale-out) to tell intercept from slope; without
it, a fixed cost would be read as per-byte cost and the gain of one more shard overestimated. The model also keeps
the count of windows each shard was observed in and the EWMA of the relative deviation of single
windows from the estimate; these give the uncertainty the search uses for exploration. A shard
never observed (a new one) is assumed to cost the median of the observed shards, with a large
uncertainty. The migration cost per byte is learned the same way from measured migration pauses.

Shard indices at or above ``num_shards`` are valid in queries and mean "a new, unobserved shard",
so a planner can try a placement with one more shard before it exists.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

from cmdare.ps.placement import Placement
from cmdare.ps.psld.load import ShardCost

__all__ = ["CostModel"]

DEFAULT_PER_BYTE_S = 1e-9  # 1 GB/s of parameter bytes per push; only used before any measurement
DEFAULT_MIGRATION_S_PER_BYTE = 2e-9  # prior for the pause a migration causes, per byte moved
HISTORY = 16  # recent windows per shard kept for the overhead fit


class CostModel:
    """Per-shard cost estimates learned online (see the module docstring for the model).

    Args:
        num_shards: shards at the start.
        alpha: EWMA weight of the newest window (0 < alpha <= 1).
        push_overhead_s: fixed cost of one push on a non-empty shard (a hint when ``learn_overhead``).
        learn_overhead: re-fit ``push_overhead_s`` from the measurements.
        block_overhead_s: cost per block per push.
        default_per_byte_s: per-byte cost assumed before any shard was measured.
        migration_s_per_byte: prior migration cost per byte, replaced by measurements.
        prior_rel_sd: relative uncertainty of a never-observed shard's per-byte cost.
        min_rel_sd: floor of the relative uncertainty of an observed shard.
    """

    def __init__(self, num_shards: int, *, alpha: float = 0.3, push_overhead_s: float = 0.0,
                 block_overhead_s: float = 0.0, default_per_byte_s: float = DEFAULT_PER_BYTE_S,
                 migration_s_per_byte: float = DEFAULT_MIGRATION_S_PER_BYTE, prior_rel_sd: float = 0.5,
                 min_rel_sd: float = 0.02, learn_overhead: bool = True):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if num_shards < 1:
            raise ValueError("a cost model needs at least one shard")
        self.alpha = alpha
        self.push_overhead_s = push_overhead_s  # replaced by the fit when learn_overhead
        self.learn_overhead = learn_overhead
        self.block_overhead_s = block_overhead_s
        self.default_per_byte_s = default_per_byte_s
        self.prior_rel_sd = prior_rel_sd
        self.min_rel_sd = min_rel_sd
        self._num = [0.0] * num_shards  # EWMA of (time per push - block overheads)
        self._den = [0.0] * num_shards  # EWMA of held bytes
        self._count = [0] * num_shards
        self._dev = [0.0] * num_shards  # EWMA of |window estimate / model estimate - 1|
        self._hist: list[deque[tuple[float, float]]] = [deque(maxlen=HISTORY) for _ in range(num_shards)]
        self._mig_num = migration_s_per_byte  # EWMA of pause seconds, seeded with the prior for 1 byte
        self._mig_den = 1.0
        self.migrations_observed = 0

    @property
    def num_shards(self) -> int:
        return len(self._count)

    # ----- learning -------------------------------------------------------------------------
    def update(self, costs: Sequence[ShardCost]) -> None:
        """Fold one window's :func:`~cmdare.ps.psld.load.shard_costs` into the estimates."""
        for c in costs:
            s = c.shard_id
            if c.per_byte_s is None or s >= self.num_shards:
                continue
            y = max(c.time_per_push_s - self.block_overhead_s * c.blocks, 0.0)
            if self._count[s] == 0:
                self._num[s], self._den[s] = y, float(c.held_bytes)
            else:
                est = self.per_byte_s(s)
                window = max(y - self.push_overhead_s, 0.0) / c.held_bytes
                rel = abs(window / est - 1.0) if est > 0 else 1.0
                self._dev[s] = (1 - self.alpha) * self._dev[s] + self.alpha * rel
                self._num[s] = (1 - self.alpha) * self._num[s] + self.alpha * y
                self._den[s] = (1 - self.alpha) * self._den[s] + self.alpha * c.held_bytes
            self._count[s] += 1
            self._hist[s].append((float(c.held_bytes), y))
        if self.learn_overhead:
            self._refit_overhead()

    def _refit_overhead(self) -> None:
        """Median intercept of per-shard lines through (held bytes, time per push), clamped."""
        intercepts = []
        for hist in self._hist:
            xs = [x for x, _ in hist]
            if len(hist) < 3 or max(xs) < 1.25 * min(xs):
                continue
            mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in hist)
            sxx = sum((x - mx) ** 2 for x in xs)
            slope = sum((x - mx) * (y - my) for x, y in hist) / sxx
            if slope > 0:
                intercepts.append(my - slope * mx)
        if intercepts:
            cap = 0.9 * min(self._num[s] for s in self.observed())
            self.push_overhead_s = min(max(statistics.median(intercepts), 0.0), cap)

    def observe_migration(self, nbytes: int, pause_s: float) -> None:
        """Record that migrating ``nbytes`` paused training for ``pause_s`` seconds."""
        if nbytes <= 0:
            return
        a = 0.5 if self.migrations_observed else 1.0  # the first measurement replaces the prior
        self._mig_num = (1 - a) * self._mig_num + a * pause_s
        self._mig_den = (1 - a) * self._mig_den + a * nbytes
        self.migrations_observed += 1

    def add_shard(self) -> None:
        """Track one more (unobserved) shard at index ``num_shards``."""
        for lst, v in ((self._num, 0.0), (self._den, 0.0), (self._count, 0), (self._dev, 0.0)):
            lst.append(v)
        self._hist.append(deque(maxlen=HISTORY))

    def remove_shard(self, shard: int) -> None:
        """Forget ``shard``; higher indices shift down by one, as in the placement."""
        for lst in (self._num, self._den, self._count, self._dev, self._hist):
            del lst[shard]

    # ----- queries --------------------------------------------------------------------------
    def count(self, shard: int) -> int:
        """Windows in which ``shard`` was observed (0 for a new shard)."""
        return self._count[shard] if shard < self.num_shards else 0

    @property
    def total_count(self) -> int:
        return sum(self._count)

    def observed(self) -> list[int]:
        """Shards with at least one observation."""
        return [s for s in range(self.num_shards) if self._count[s] > 0 and self._den[s] > 0]

    def per_byte_s(self, shard: int) -> float:
        """Estimated seconds per push per held byte on ``shard`` (the median for an unobserved one)."""
        if shard < self.num_shards and self._count[shard] > 0 and self._den[shard] > 0:
            return max(self._num[shard] - self.push_overhead_s, 0.0) / self._den[shard]
        known = [max(self._num[s] - self.push_overhead_s, 0.0) / self._den[s] for s in self.observed()]
        return statistics.median(known) if known else self.default_per_byte_s

    def rel_uncertainty(self, shard: int) -> float:
        """Relative standard error of ``shard``'s per-byte cost estimate.

        The standard deviation of single windows (at least ``min_rel_sd``) times ``sqrt(1/n)`` for ``n`` windows,
        but never below the EWMA's own floor ``sqrt(alpha / (2 - alpha))``: the estimator forgets,
        so it never becomes certain (which also lets it follow a shard that slows down later).
        """
        n = self.count(shard)
        if n == 0:
            return self.prior_rel_sd
        shrink = max(1.0 / n, self.alpha / (2.0 - self.alpha))
        sd = self._dev[shard] * math.sqrt(math.pi / 2)  # mean absolute deviation -> sd (Gaussian)
        return max(sd, self.min_rel_sd) * math.sqrt(shrink)

    def optimism(self, shard: int, explore: float) -> float:
        """UCB discount on ``shard``'s per-byte cost: ``explore * sd * sqrt(ln(1 + N))``, at most 0.5."""
        if explore <= 0:
            return 0.0
        return min(0.5, explore * self.rel_uncertainty(shard) * math.sqrt(math.log1p(self.total_count)))

    def shard_time_s(self, shard: int, held_bytes: int, blocks: int) -> float:
        """Predicted seconds per push of ``shard`` holding ``held_bytes`` in ``blocks`` blocks."""
        if blocks == 0:
            return 0.0
        return self.push_overhead_s + self.block_overhead_s * blocks + self.per_byte_s(shard) * held_bytes

    def predict(self, placement: Placement) -> list[float]:
        """Predicted seconds per push of every shard under ``placement``."""
        held = placement.shard_bytes()
        counts = [0] * placement.num_shards
        for s in placement.shard_of:
            counts[s] += 1
        return [self.shard_time_s(s, held[s], counts[s]) for s in range(placement.num_shards)]

    def balanced_time_s(self, shards: Sequence[int], total_bytes: int, total_blocks: int) -> float:
        """Seconds per push of the slowest shard if ``total_bytes`` were spread ideally over ``shards``.

        Each shard gets bytes in inverse proportion to its per-byte cost (a fluid bound that ignores
        block granularity): ``T = (total + sum(o_s / c_s)) / sum(1 / c_s)``.
        """
        if not shards:
            return math.inf
        blocks_each = total_blocks / len(shards)
        over = self.push_overhead_s + self.block_overhead_s * blocks_each
        inv = [1.0 / max(self.per_byte_s(s), 1e-18) for s in shards]
        return (total_bytes + over * sum(inv)) / sum(inv)

    def migration_s_per_byte(self) -> float:
        """Learned (or prior) pause seconds per migrated byte."""
        return self._mig_num / self._mig_den

    def migration_cost_s(self, nbytes: int) -> float:
        """Predicted pause of migrating ``nbytes``."""
        return self.migration_s_per_byte() * nbytes
