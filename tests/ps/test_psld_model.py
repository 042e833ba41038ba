"""PSLD cost model, move search and decision values."""

from __future__ import annotations

import pytest

from cmdare.errors import UserInputError
from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import Placement, get_placement
from cmdare.ps.psld import (
    AddShard,
    CostModel,
    Move,
    NoChange,
    RemoveShard,
    ShardLoad,
    apply_decisions,
    moved_bytes,
    plan_drain,
    plan_rebalance,
    shard_costs,
)


def _even(num_blocks: int = 12, num_shards: int = 3) -> Placement:
    params = param_infos([(f"p{i}", (1000,)) for i in range(num_blocks)])  # 4000 bytes each
    return get_placement("round-robin").place(params, num_shards)


def _window(pl: Placement, per_byte: list[float], *, overhead_s: float = 0.0, noise: list[float] | None = None):
    held = pl.shard_bytes()
    noise = noise or [1.0] * pl.num_shards
    return [ShardLoad(s, 1e-3, 10, 10 * held[s], 10 * held[s],
                      10 * (overhead_s + per_byte[s] * held[s]) * noise[s], 0.0, 0.0)
            for s in range(pl.num_shards)]


def _trained(pl: Placement, per_byte: list[float], windows: int = 3) -> CostModel:
    model = CostModel(pl.num_shards)
    for _ in range(windows):
        model.update(shard_costs(_window(pl, per_byte), pl))
    return model


def test_cost_model_learns_per_byte_costs_and_predicts_candidate_placements() -> None:
    pl = _even()
    model = _trained(pl, [1e-9, 1e-9, 3e-9])
    assert [model.per_byte_s(s) for s in range(3)] == pytest.approx([1e-9, 1e-9, 3e-9])
    assert model.count(0) == 3 and model.total_count == 9
    assert model.predict(pl) == pytest.approx([16e-6, 16e-6, 48e-6])
    moved = pl.moved({2: 0, 5: 1})  # blocks 2 and 5 live on shard 2
    assert model.predict(moved) == pytest.approx([20e-6, 20e-6, 24e-6])
    # a new shard is assumed to cost the median, with large uncertainty
    assert model.per_byte_s(3) == pytest.approx(1e-9) and model.count(3) == 0
    assert model.rel_uncertainty(3) > 5 * model.rel_uncertainty(0)
    assert model.optimism(3, 1.0) > model.optimism(0, 1.0) > 0 == model.optimism(0, 0.0)


def test_cost_model_follows_a_shard_that_slows_down_and_separates_overheads() -> None:
    pl = _even()
    model = CostModel(3, alpha=0.5, push_overhead_s=2e-5)
    for _ in range(3):
        model.update(shard_costs(_window(pl, [1e-9] * 3, overhead_s=2e-5), pl, push_overhead_s=2e-5))
    assert model.per_byte_s(2) == pytest.approx(1e-9)  # the fixed 20 us are not taken as bytes
    for _ in range(8):
        model.update(shard_costs(_window(pl, [1e-9, 1e-9, 3e-9], overhead_s=2e-5), pl, push_overhead_s=2e-5))
    assert model.per_byte_s(2) == pytest.approx(3e-9, rel=0.01)


def test_uncertainty_reflects_noise_but_never_vanishes() -> None:
    pl = _even()
    quiet, noisy = CostModel(3), CostModel(3)
    for i in range(40):
        quiet.update(shard_costs(_window(pl, [1e-9] * 3), pl))
        wobble = [1.0 + (0.2 if (i + s) % 2 else -0.2) for s in range(3)]
        noisy.update(shard_costs(_window(pl, [1e-9] * 3, noise=wobble), pl))
    assert noisy.rel_uncertainty(0) > 3 * quiet.rel_uncertainty(0) > 0


def test_migration_cost_is_learned_from_measured_pauses() -> None:
    model = CostModel(2, migration_s_per_byte=1e-9)
    assert model.migration_cost_s(1_000_000) == pytest.approx(1e-3)
    model.observe_migration(2_000_000, 0.010)
    assert model.migration_s_per_byte() == pytest.approx(5e-9)
    model.observe_migration(0, 1.0)  # nothing moved: ignored
    assert model.migration_s_per_byte() == pytest.approx(5e-9)


def test_plan_rebalance_moves_bytes_off_a_slow_shard_until_balanced() -> None:
    pl = _even(num_blocks=30)
    model = _trained(pl, [1e-9, 1e-9, 3e-9])
    plan = plan_rebalance(pl, model)
    assert plan.moves and all(m.src == 2 for m in plan.moves[:2])
    after = pl.moved({m.block_id: m.dst for m in plan.moves})
    times = model.predict(after)
    assert max(times) / (sum(times) / 3) < 1.15
    assert plan.gain_s == pytest.approx(max(plan.times_before_s) - max(times))
    assert plan.moved_bytes == 4000 * len(plan.moves)
    # a balanced cluster gets no plan
    assert plan_rebalance(pl, _trained(pl, [1e-9] * 3)).moves == ()


def test_plan_fills_a_new_shard_and_drains_one() -> None:
    pl = _even(num_blocks=12, num_shards=2)
    model = _trained(pl, [1e-9, 1e-9])
    grown = Placement(pl.blocks, pl.shard_of, 3)
    fill = plan_rebalance(grown, model, explore=1.0)
    assert fill.moves and {m.dst for m in fill.moves} == {2}
    assert max(fill.times_after_s) < max(fill.times_before_s)
    drain = plan_drain(pl, model, 1)
    assert {m.src for m in drain.moves} == {1} and len(drain.moves) == 6
    assert apply_decisions(pl, [*drain.moves, RemoveShard(1)]).num_shards == 1


def test_apply_decisions_renumbers_after_removal_and_rejects_stale_moves() -> None:
    pl = _even(num_blocks=6, num_shards=3)  # blocks 0..5 on shards 0,1,2,0,1,2
    new = apply_decisions(pl, [Move(1, 1, 0), Move(4, 1, 2), RemoveShard(1)])
    assert new.num_shards == 2 and new.version == pl.version + 1
    assert new.shard_of == (0, 0, 1, 0, 1, 1)  # old shard 2 is now shard 1
    grown = apply_decisions(pl, [AddShard(), Move(0, 0, 3)])
    assert grown.num_shards == 4 and grown.shard_of_block(0) == 3
    assert apply_decisions(pl, [NoChange("x")]) is pl
    assert moved_bytes(pl, [Move(1, 1, 0), AddShard(), Move(4, 1, 2)]) == 8000
    with pytest.raises(ValueError, match="is on shard"):
        apply_decisions(pl, [Move(1, 0, 2)])
    with pytest.raises(ValueError, match="still holds"):
        apply_decisions(pl, [RemoveShard(0)])
    with pytest.raises(ValueError, match="out of range"):
        apply_decisions(pl, [Move(1, 1, 7)])
    one = get_placement("round-robin").place(param_infos([("a", (4,))]), 1)
    with pytest.raises(UserInputError, match="last"):
        apply_decisions(one, [RemoveShard(0)])


def test_decisions_are_frozen_values() -> None:
    m = Move(3, 0, 1)
    assert m == Move(3, 0, 1) and hash(m) == hash(Move(3, 0, 1))
    with pytest.raises(AttributeError):
        m.dst = 2  # type: ignore[misc]
    assert RemoveShard(1) != RemoveShard(2) and AddShard() == AddShard()


def test_public_api_is_pinned() -> None:
    import cmdare.ps.psld as psld

    assert sorted(psld.__all__) == sorted([
        "AddShard", "BlockLoad", "CostModel", "Decision", "Move", "NoChange", "Plan", "PsldBalancer",
        "RemoveShard", "ShardCost", "ShardDiagnosis", "ShardLoad", "ShardState", "apply_decisions",
        "block_costs", "diagnose", "moved_bytes", "plan_drain", "plan_rebalance", "predict_after",
        "shard_costs"])
    assert all(hasattr(psld, name) for name in psld.__all__)


def test_push_overhead_is_learned_once_bytes_change() -> None:
    pl = _even(num_blocks=12, num_shards=2)
    model = CostModel(2)  # hint 0; the truth is 50 us per push plus 1 ns per byte
    for _ in range(3):
        model.update(shard_costs(_window(pl, [1e-9, 2e-9], overhead_s=5e-5), pl))
    assert model.push_overhead_s == 0.0  # bytes never changed: intercept and slope cannot be told apart
    assert model.per_byte_s(0) > 2e-9
    lighter = pl.moved({0: 1, 2: 1, 4: 1})  # shard 0: 24000 -> 12000 bytes
    for _ in range(3):
        model.update(shard_costs(_window(lighter, [1e-9, 2e-9], overhead_s=5e-5), lighter))
    assert model.push_overhead_s == pytest.approx(5e-5, rel=0.05)
    assert model.per_byte_s(0) == pytest.approx(1e-9, rel=0.1)
    fixed = CostModel(2, push_overhead_s=1e-5, learn_overhead=False)
    for p in (pl, lighter, lighter, lighter):
        fixed.update(shard_costs(_window(p, [1e-9, 2e-9], overhead_s=5e-5), p))
    assert fixed.push_overhead_s == 1e-5
