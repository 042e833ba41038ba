"""Load measurements, per-byte and per-block costs, and the straggler detector."""

from __future__ import annotations

import pytest

from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import get_placement
from cmdare.ps.psld import ShardLoad, ShardState, block_costs, diagnose, shard_costs


def _placement(num_shards: int = 3):
    params = param_infos([(f"p{i}", (1000,)) for i in range(6)])  # 4000 bytes each
    return get_placement("round-robin").place(params, num_shards)  # 2 blocks, 8000 bytes per shard


def _load(shard: int, per_byte_s: float, held: int, *, pushes: int = 10, overhead_s: float = 0.0,
          window_s: float = 1e-4) -> ShardLoad:
    busy = pushes * (overhead_s + per_byte_s * held)
    return ShardLoad(shard, window_s, pushes, pushes * held, pushes * held, busy, 0.5 * busy, 0.0)


def test_shard_load_derived_figures_and_validation() -> None:
    ld = ShardLoad(0, 2.0, 4, 400, 400, 1.0, 0.6, 0.2, wait_s=1.5)
    assert ld.busy_fraction == pytest.approx(0.5)
    assert ld.time_per_push_s == pytest.approx(0.25)
    assert ld.queue_per_push_s == pytest.approx(0.05)
    assert ShardLoad(0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0).time_per_push_s == 0.0
    with pytest.raises(ValueError):
        ShardLoad(0, 1.0, -1, 0, 0, 0.0, 0.0, 0.0)


def test_shard_costs_remove_overheads_and_block_costs_scale_with_bytes() -> None:
    pl = _placement()
    loads = [_load(s, c, 8000, overhead_s=1e-4 + 2 * 1e-5) for s, c in enumerate([1e-9, 1e-9, 3e-9])]
    costs = shard_costs(loads, pl, push_overhead_s=1e-4, block_overhead_s=1e-5)
    assert [c.per_byte_s for c in costs] == pytest.approx([1e-9, 1e-9, 3e-9])
    assert [c.blocks for c in costs] == [2, 2, 2] and costs[0].held_bytes == 8000
    per_block = block_costs(loads, pl, push_overhead_s=1e-4, block_overhead_s=1e-5)
    assert per_block[0] == pytest.approx(1e-9 * 4000 + 1e-5)
    assert per_block[2] == pytest.approx(3e-9 * 4000 + 1e-5)  # block 2 sits on the slow shard 2
    with pytest.raises(ValueError):
        shard_costs([_load(5, 1e-9, 8000)], pl)


def test_detector_tells_a_slow_shard_from_a_heavy_placement() -> None:
    pl = _placement()
    # shard 2 is 3x slower per byte, with the same bytes: slow and the bottleneck
    slow = diagnose(shard_costs([_load(s, c, 8000) for s, c in enumerate([1e-9, 1e-9, 3e-9])], pl))
    assert [d.state for d in slow] == [ShardState.OK, ShardState.OK, ShardState.SLOW_AND_HEAVY]
    assert slow[2].per_byte_ratio == pytest.approx(3.0)
    # same per-byte cost everywhere, but shard 0 holds 4x the bytes: heavy, not slow
    params = param_infos([("big", (4000,)), ("a", (1000,)), ("b", (1000,))])
    heavy_pl = get_placement("round-robin").place(params, 3)
    held = heavy_pl.shard_bytes()
    heavy = diagnose(shard_costs([_load(s, 1e-9, held[s]) for s in range(3)], heavy_pl))
    assert heavy[0].state == ShardState.HEAVY and heavy[0].per_byte_ratio == pytest.approx(1.0)
    assert heavy[1].state == ShardState.OK
    # a slow shard that already holds few bytes is slow but no longer the bottleneck
    small_pl = get_placement("round-robin").place(param_infos([("a", (2000,)), ("b", (2000,)), ("c", (667,))]), 3)
    held = small_pl.shard_bytes()
    few = diagnose(shard_costs([_load(s, c, held[s]) for s, c in enumerate([1e-9, 1e-9, 3e-9])], small_pl))
    assert few[2].state == ShardState.SLOW and few[2].load_ratio < 1.15


def test_detector_flags_idle_and_empty_shards() -> None:
    pl = _placement(3)
    loads = [_load(s, 1e-9, 8000, window_s=1.0) for s in range(3)]
    assert {d.state for d in diagnose(shard_costs(loads, pl))} == {ShardState.IDLE}  # busy 8e-5 of 1 s
    params = param_infos([("a", (10,)), ("b", (10,))])
    two = get_placement("round-robin").place(params, 3)
    loads = [_load(s, 1e-9, h, window_s=1e-6) for s, h in enumerate(two.shard_bytes())]
    states = [d.state for d in diagnose(shard_costs(loads, two))]
    assert states[2] == ShardState.EMPTY and states[0] == ShardState.OK


def test_shard_load_from_the_engines_shard_stats() -> None:
    from cmdare.ps.shard import ShardStats

    stats = ShardStats(shard_id=1, step=40, window_s=2.0, pushes=40, bytes_in=4000, bytes_out=4000,
                       busy_s=0.5, num_params=100, num_blocks=3, apply_s=0.3, queue_s=0.2, wait_s=0.9)
    ld = ShardLoad.from_stats(stats)
    assert (ld.shard_id, ld.pushes, ld.bytes_in, ld.busy_s, ld.apply_s, ld.queue_s, ld.wait_s) == \
        (1, 40, 4000, 0.5, 0.3, 0.2, 0.9)
    assert ShardLoad.from_stats(stats, wait_s=0.7).wait_s == 0.7
    assert ld.busy_fraction == pytest.approx(0.25)
