"""The PSLD balancer: a policy that turns shard load measurements into placement decisions.

It decides and never does: the parameter-server controller feeds it one window of
:class:`~cmdare.ps.psld.load.ShardLoad` at a time, asks for decisions, carries them out (migrations,
new or removed shards) and reports back what it did::

    balancer = PsldBalancer(placement.num_shards, placement, elastic=True)
    ...every few steps, at an iteration boundary:
    balancer.observe(loads, global_step)          # loads measured under balancer.placement
    decisions = balancer.decide(global_step)      # [NoChange(...)] most of the time
    ...execute the Move/AddShard/RemoveShard decisions in order, timing the pause...
    placement = balancer.apply(done)              # the decisions actually carried out
    balancer.observe_migration(moved_bytes, pause_s)
    ...start a fresh measurement window on every shard

Each decision (every ``interval_steps`` steps, and only after a fresh window since the last change):

1. **Rebalance.** :func:`~cmdare.ps.psld.search.plan_rebalance` plans moves off the slowest shard
   with UCB optimism for uncertain destinations. The plan is taken only if its predicted gain
   (drop of the slowest shard's time, mean estimates) is at least ``min_gain_frac`` of the current
   time and, summed over ``payback_steps`` steps, exceeds the predicted migration pause of the
   whole plan: migration never costs more than it saves. At most ``max_moves`` moves are returned;
   the rest of the plan is re-planned at the next decision with fresh measurements.
2. **Scale out** (``elastic``): when every shard is saturated (busy fraction >= ``saturated_busy``)
   and a placement with one more shard, filled by the planner, is predicted to cut the step time
   by ``scale_out_min_gain`` and to pay for its migration within ``cooldown_decisions + 1``
   intervals (the least it stays): ``[AddShard(), Move(..., dst=new), ...]``. The model's prediction is
   checked against measurement: if the last shard added cut the measured step time by less than
   half of ``scale_out_min_gain``, scaling out stops until the step time grows by 20% (more load).
3. **Scale in** (``elastic``): when every shard is idle (busy fraction <= ``idle_busy``) and the
   shards left after draining the costliest one would stay below ``scale_in_max_busy``:
   ``[Move(..., src=k), ..., RemoveShard(k)]``.

Hysteresis (``min_gain_frac``), the payback check, the interval, a cooldown after scaling and UCB
exploration that fades with observations make the moves stop once the cluster is balanced.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from cmdare.errors import UserInputError
from cmdare.ps.placement import Placement
from cmdare.ps.psld.cost_model import DEFAULT_MIGRATION_S_PER_BYTE, CostModel
from cmdare.ps.psld.decisions import AddShard, Decision, Move, NoChange, RemoveShard, apply_decisions
from cmdare.ps.psld.detector import ShardDiagnosis, diagnose
from cmdare.ps.psld.load import ShardCost, ShardLoad, shard_costs
from cmdare.ps.psld.search import Plan, plan_drain, plan_rebalance

__all__ = ["PsldBalancer"]


class PsldBalancer:
    """Decides block moves and shard additions/removals from measured shard loads.

    Args:
        num_shards: shards of ``placement`` (checked).
        placement: the current placement (e.g. from the ``psld`` strategy).
        max_moves: most moves returned by one rebalancing decision.
        interval_steps: global steps between two decisions.
        explore: UCB exploration coefficient (0: pure exploitation).
        seed: kept for a stable API; the UCB search is deterministic, so it changes nothing.
        min_gain_frac: smallest predicted relative gain worth a migration (hysteresis).
        noise_z: the predicted gain must also exceed ``noise_z`` standard errors of the estimates.
        payback_steps: steps over which a plan's gain must exceed its migration pause
            (default ``interval_steps``: it must pay for itself within one interval).
        elastic: allow ``AddShard``/``RemoveShard`` decisions.
        min_shards, max_shards: bounds for elastic scaling.
        saturated_busy: busy fraction from which a shard counts as saturated.
        idle_busy: busy fraction up to which a shard counts as idle.
        scale_out_min_gain: smallest predicted relative gain that justifies one more shard.
        scale_in_max_busy: highest predicted busy fraction the remaining shards may reach.
        cooldown_decisions: decisions without scaling after a scaling decision.
        push_overhead_s, block_overhead_s, alpha, migration_s_per_byte: passed to :class:`CostModel`.

    Raises:
        UserInputError: inconsistent arguments.
    """

    def __init__(self, num_shards: int, placement: Placement, *, max_moves: int = 8, interval_steps: int = 50,
                 explore: float = 1.0, seed: int = 0, min_gain_frac: float = 0.02, noise_z: float = 2.0,
                 payback_steps: int | None = None, elastic: bool = False, min_shards: int = 1,
                 max_shards: int = 16, saturated_busy: float = 0.8, idle_busy: float = 0.3,
                 scale_out_min_gain: float = 0.1, scale_in_max_busy: float = 0.6, cooldown_decisions: int = 3,
                 push_overhead_s: float = 0.0, block_overhead_s: float = 0.0, alpha: float = 0.3,
                 migration_s_per_byte: float = DEFAULT_MIGRATION_S_PER_BYTE):
        if placement.num_shards != num_shards:
            raise UserInputError(f"placement has {placement.num_shards} shards, not {num_shards}")
        if max_moves < 1 or interval_steps < 1 or explore < 0 or min_gain_frac < 0:
            raise UserInputError("max_moves and interval_steps must be positive, "
                                 "explore and min_gain_frac non-negative")
        if not 1 <= min_shards <= max_shards:
            raise UserInputError(f"need 1 <= min_shards <= max_shards, got {min_shards}, {max_shards}")
        self.placement = placement
        self.max_moves, self.interval_steps = max_moves, interval_steps
        self.explore, self.seed = explore, seed
        self.min_gain_frac, self.noise_z = min_gain_frac, noise_z
        self.payback_steps = payback_steps or interval_steps
        self.elastic, self.min_shards, self.max_shards = elastic, min_shards, max_shards
        self.saturated_busy, self.idle_busy = saturated_busy, idle_busy
        self.scale_out_min_gain, self.scale_in_max_busy = scale_out_min_gain, scale_in_max_busy
        self.cooldown_decisions = cooldown_decisions
        self.model = CostModel(num_shards, alpha=alpha, push_overhead_s=push_overhead_s,
                               block_overhead_s=block_overhead_s, migration_s_per_byte=migration_s_per_byte)
        self.pushes_per_step = 1.0
        self.step_time_s = 0.0
        self.last_costs: list[ShardCost] = []
        self.last_plan: Plan | None = None
        self.decisions_made = 0
        self.moves_made = 0
        self._fresh = 0
        self._last_obs_step: int | None = None
        self._last_decision_step: int | None = None
        self._cooldown = 0
        self._last_add_step_s: float | None = None  # step time measured before the last scale-out
        self._plateau_step_s: float | None = None  # step time at which adding a shard stopped helping

    @property
    def num_shards(self) -> int:
        return self.placement.num_shards

    # ----- inputs ---------------------------------------------------------------------------
    def observe(self, loads: Sequence[ShardLoad], global_step: int) -> None:
        """Record one measurement window that ended at ``global_step`` under :attr:`placement`.

        Raises:
            ValueError: a load names a shard the placement does not have.
        """
        costs = shard_costs(loads, self.placement, push_overhead_s=self.model.push_overhead_s,
                            block_overhead_s=self.model.block_overhead_s)
        self.model.update(costs)
        steps = global_step - (self._last_obs_step or 0)
        pushes = max((ld.pushes for ld in loads), default=0)
        if steps > 0 and pushes > 0:
            self.pushes_per_step = pushes / steps
            self.step_time_s = max(ld.window_s for ld in loads) / steps
        self._last_obs_step = global_step
        self.last_costs = costs
        self._fresh += 1

    def observe_migration(self, nbytes: int, pause_s: float) -> None:
        """Record the measured pause of migrating ``nbytes`` (teaches the migration cost)."""
        self.model.observe_migration(nbytes, pause_s)

    # ----- the policy -----------------------------------------------------------------------
    def decide(self, global_step: int) -> list[Decision]:
        """Decisions for an iteration boundary at ``global_step`` (``[NoChange(reason)]`` if none)."""
        last = self._last_decision_step
        if last is not None and global_step - last < self.interval_steps:
            return [NoChange(f"next decision at step {self._last_decision_step + self.interval_steps}")]
        if self._fresh == 0:
            return [NoChange("waiting for a measurement window under the current placement")]
        self._last_decision_step = global_step
        self.decisions_made += 1
        self._cooldown = max(0, self._cooldown - 1)
        now_s = max(self.model.predict(self.placement), default=0.0)
        plan = self._best_plan(self.placement, now_s, self.min_gain_frac)
        self.last_plan = plan
        if plan.moves and self._worth_it(plan, now_s, self.min_gain_frac):
            return list(plan.moves[: self.max_moves])
        if self.elastic and self._cooldown == 0:
            scaled = self._scale_out(now_s) or self._scale_in(now_s)
            if scaled:
                return scaled
        if not plan.moves:
            return [NoChange("balanced: no move lowers the slowest shard's predicted time")]
        return [NoChange(f"predicted gain {plan.gain_s / now_s:.1%} does not pay for its migration"
                         if now_s > 0 else "no load measured")]

    def _best_plan(self, placement: Placement, now_s: float, min_gain: float) -> Plan:
        """The UCB plan if it pays in expectation, else the pure exploitation plan."""
        plan = plan_rebalance(placement, self.model, explore=self.explore)
        if self.explore == 0 or (plan.moves and self._worth_it(plan, now_s, min_gain)):
            return plan
        greedy = plan_rebalance(placement, self.model, explore=0.0)
        return greedy if greedy.moves and self._worth_it(greedy, now_s, min_gain) else plan

    def _worth_it(self, plan: Plan, now_s: float, min_gain: float, horizon: int = 1) -> bool:
        """Gain above hysteresis and noise, and paid back within ``horizon * payback_steps``."""
        gain_s = plan.gain_s
        if now_s <= 0 or gain_s < min_gain * now_s or gain_s < self.noise_z * self._noise_s(plan):
            return False
        saved_s = gain_s * self.pushes_per_step * self.payback_steps * horizon
        return saved_s > self.model.migration_cost_s(plan.moved_bytes)

    def _noise_s(self, plan: Plan) -> float:
        """Standard error of the predicted gain: the touched shards' estimate errors combined."""
        touched = {m.src for m in plan.moves} | {m.dst for m in plan.moves}
        before = plan.times_before_s
        return math.sqrt(sum((self.model.rel_uncertainty(s) * before[s]) ** 2
                             for s in touched if s < len(before)))

    def _busy(self) -> list[float]:
        return [c.busy_fraction for c in self.last_costs]

    def _scale_out(self, now_s: float) -> list[Decision]:
        busy = self._busy()
        if self.num_shards >= self.max_shards or not busy or min(busy) < self.saturated_busy:
            return []
        if self._last_add_step_s is not None and self.step_time_s > 0:
            measured_gain = 1.0 - self.step_time_s / self._last_add_step_s
            if measured_gain < self.scale_out_min_gain / 2:  # the last shard added did not pay off
                self._plateau_step_s = self.step_time_s
            self._last_add_step_s = None
        if self._plateau_step_s is not None and self.step_time_s < 1.2 * self._plateau_step_s:
            return []
        plan = self.plan_fill()
        step_s = self.step_time_s if self.step_time_s > 0 else now_s * self.pushes_per_step
        if plan.gain_s * self.pushes_per_step < self.scale_out_min_gain * step_s:
            return []
        # A new shard stays at least until the cooldown ends: it has that long to pay for its migration.
        if plan.moves and self._worth_it(plan, now_s, 0.0, horizon=self.cooldown_decisions + 1):
            self._last_add_step_s = self.step_time_s or None
            self._plateau_step_s = None
            return [AddShard(), *plan.moves]
        return []

    def _scale_in(self, now_s: float) -> list[Decision]:
        busy = self._busy()
        if self.num_shards <= self.min_shards or not busy or max(busy) > self.idle_busy or now_s <= 0:
            return []
        victim = max(range(self.num_shards), key=lambda s: (self.model.per_byte_s(s), s))
        plan = self.plan_drain(victim)
        after_s = max(t for s, t in enumerate(plan.times_after_s) if s != victim)
        if max(busy) * after_s / now_s > self.scale_in_max_busy:
            return []
        return [*plan.moves, RemoveShard(victim)]

    # ----- plans the controller may ask for directly ----------------------------------------
    def plan_fill(self) -> Plan:
        """Moves that fill one new shard (index ``num_shards``) from the current ones."""
        grown = Placement(self.placement.blocks, self.placement.shard_of, self.num_shards + 1,
                          self.placement.version, self.placement.strategy)
        return self._best_plan(grown, max(self.model.predict(self.placement), default=0.0), 0.0)

    def plan_drain(self, shard: int) -> Plan:
        """Moves that empty ``shard`` onto the others (run them before ``RemoveShard(shard)``).

        Raises:
            UserInputError: ``shard`` does not exist or is the last one.
        """
        if not 0 <= shard < self.num_shards:
            raise UserInputError(f"no shard {shard}; the placement has {self.num_shards}")
        if self.num_shards == 1:
            raise UserInputError("cannot remove the last parameter shard")
        return plan_drain(self.placement, self.model, shard)

    def add_shard(self) -> list[Decision]:
        """Decisions that add one shard and fill it (for ``cmdare ps add``)."""
        if self.num_shards >= self.max_shards:
            raise UserInputError(f"already at the maximum of {self.max_shards} shards")
        return [AddShard(), *self.plan_fill().moves]

    def remove_shard(self, shard: int) -> list[Decision]:
        """Decisions that drain and remove ``shard`` (for ``cmdare ps remove``)."""
        return [*self.plan_drain(shard).moves, RemoveShard(shard)]

    # ----- outputs --------------------------------------------------------------------------
    def apply(self, decisions: Sequence[Decision]) -> Placement:
        """Record that ``decisions`` were carried out, in order; returns the new placement.

        Raises:
            ValueError: a decision does not fit the current placement (stale or already applied).
        """
        new = apply_decisions(self.placement, decisions)
        for d in decisions:
            if isinstance(d, AddShard):
                self.model.add_shard()
                self._cooldown = self.cooldown_decisions
            elif isinstance(d, RemoveShard):
                self.model.remove_shard(d.shard_id)
                self._cooldown = self.cooldown_decisions
        changed = [d for d in decisions if not isinstance(d, NoChange)]
        if changed:
            self._fresh = 0
            self.last_costs = []
            self.moves_made += sum(isinstance(d, Move) for d in changed)
        self.placement = new
        return new

    def set_placement(self, placement: Placement) -> None:
        """Replace the placement (e.g. after a rolled-back migration); the shard count must match."""
        if placement.num_shards != self.num_shards:
            raise UserInputError(f"placement has {placement.num_shards} shards, "
                                 f"the balancer {self.num_shards}")
        self.placement = placement
        self._fresh = 0

    def diagnose(self) -> list[ShardDiagnosis]:
        """Straggler diagnosis of the last window, with the model's smoothed per-byte costs."""
        per_byte = [self.model.per_byte_s(s) for s in range(self.num_shards)]
        return diagnose(self.last_costs, per_byte_s=per_byte)

    def load_ratio(self) -> float:
        """Max/mean time per push over non-empty shards in the last window (1.0: balanced)."""
        times = [c.time_per_push_s for c in self.last_costs if c.held_bytes > 0]
        return max(times) / statistics.fmean(times) if times and statistics.fmean(times) > 0 else 1.0
