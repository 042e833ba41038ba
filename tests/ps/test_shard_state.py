"""ShardState and the flat optimizer against torch.optim.SGD, without Ray."""

import numpy as np
import pytest
import torch

from cmdare.ps.blocks import param_infos, split_blocks
from cmdare.ps.optimizer import OptimizerConfig, sgd_update
from cmdare.ps.placement import RoundRobin
from cmdare.ps.shard import BlockData, ShardState


@pytest.mark.parametrize("nesterov", [False, True])
def test_flat_sgd_matches_torch_sgd(nesterov):
    cfg = OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=nesterov)
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(1000).astype(np.float32)
    ref = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch.optim.SGD([ref], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                          nesterov=nesterov)
    param, buf, scratch = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for _ in range(10):
        g = rng.standard_normal(1000).astype(np.float32)
        ref.grad = torch.from_numpy(g.copy())
        opt.step()
        sgd_update(param, g, buf, cfg.lr, cfg, scratch)
    np.testing.assert_allclose(param, ref.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_lr_schedules():
    assert OptimizerConfig(lr=1.0, schedule="step", decay_steps=(10, 20), decay_factor=0.1).lr_at(15) == \
        pytest.approx(0.1)
    cos = OptimizerConfig(lr=1.0, schedule="cosine", total_steps=100)
    assert cos.lr_at(0) == pytest.approx(1.0) and cos.lr_at(100) == pytest.approx(0.0, abs=1e-12)
    warm = OptimizerConfig(lr=1.0, warmup_steps=4)
    assert [warm.lr_at(s) for s in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def _two_shards():
    infos = param_infos([("a", (3, 4)), ("b", (5,)), ("c", (2, 2)), ("d", (7,))])
    placement = RoundRobin().place(infos, 2)
    states = []
    for k in range(2):
        blocks = tuple(placement.blocks_on(k))
        n = sum(b.size for b in blocks)
        st = ShardState(k, OptimizerConfig(lr=0.1))
        st.load(BlockData(blocks, np.arange(n, dtype=np.float32) + 100 * k, np.full(n, k, np.float32), 7))
        states.append(st)
    return placement, states


def test_take_and_add_move_values_exactly():
    placement, (s0, s1) = _two_shards()
    before = {b.block_id: (s0 if placement.shard_of_block(b.block_id) == 0 else s1) for b in placement.blocks}
    snap0, snap1 = s0.snapshot(), s1.snapshot()
    moved = s0.take({2})  # block "c"
    s1.add(moved)
    assert [b.block_id for b in s1.blocks] == [1, 2, 3]
    # block 2 values and momentum are unchanged and now on shard 1, in block order
    np.testing.assert_array_equal(s1.params[5:9], snap0.params[12:16])
    np.testing.assert_array_equal(s1.momentum[5:9], np.zeros(4, np.float32))
    np.testing.assert_array_equal(s1.params[:5], snap1.params[:5])
    np.testing.assert_array_equal(s1.params[9:], snap1.params[5:])
    np.testing.assert_array_equal(s0.params, snap0.params[:12])
    assert before and s1.step == 7


def test_apply_respects_max_step_and_counts_load():
    st = ShardState(0, OptimizerConfig(lr=0.1, momentum=0.0, weight_decay=0.0), max_step=2)
    blocks = tuple(split_blocks(param_infos([("w", (4,))])))
    st.load(BlockData(blocks, np.ones(4, np.float32), np.zeros(4, np.float32), 0))
    g = np.ones(4, np.float32)
    assert st.apply(g) and st.apply(g) and not st.apply(g)
    np.testing.assert_allclose(st.params, 0.8)
    stats = st.stats()
    assert stats.pushes == 2 and stats.bytes_in == 32 and stats.step == 2
    with pytest.raises(ValueError):
        ShardState(1, OptimizerConfig()).apply(g)


def test_staleness_damping_divides_lr_by_one_plus_staleness():
    cfg = OptimizerConfig(lr=0.1, momentum=0.0, weight_decay=0.0)
    blocks = tuple(split_blocks(param_infos([("w", (2,))])))
    st = ShardState(0, cfg)
    st.load(BlockData(blocks, np.zeros(2, np.float32), np.zeros(2, np.float32), 5))
    st.staleness_damping = True
    st.apply(np.ones(2, np.float32), pulled_step=5)  # fresh: lr 0.1
    st.apply(np.ones(2, np.float32), pulled_step=3)  # staleness 3 (step is 6): lr 0.1 / 4
    np.testing.assert_allclose(st.params, -(0.1 + 0.025), rtol=1e-6)


def test_emulated_link_costs_bytes_over_bandwidth_and_a_straggler_multiplies_it():
    import time

    shard = ShardState(0, OptimizerConfig(lr=0.1))
    shard.load(BlockData(tuple(split_blocks(param_infos([("w", (25_000,))]), 1 << 30)), np.zeros(25_000, np.float32),
                         np.zeros(25_000, np.float32), 0))
    grad = np.ones(25_000, np.float32)  # 100 kB in, 100 kB out
    shard.link_bytes_per_s = 4e6  # 200 kB per push: 50 ms
    t0 = time.perf_counter()
    assert shard.serve(grad, 0, sent_at=time.time() - 0.25)
    took = time.perf_counter() - t0
    st = shard.stats()
    assert took >= 0.05 and st.busy_s >= 0.05 and st.busy_s - st.apply_s == pytest.approx(0.05, rel=1e-6)
    assert 0.25 <= st.queue_s <= 0.25 + took  # the push was sent 0.25 s before serve() began serving it
    shard.slowdown = 3.0
    assert shard.link_delay_s(200_000) == pytest.approx(0.15)
    shard.link_bytes_per_s = None
    assert shard.link_delay_s(200_000) == 0.0


def test_block_loads_split_a_shards_window_by_bytes_and_share_its_wait():
    from cmdare.ps.psld.load import ShardLoad, block_loads

    infos = param_infos([("a", (300,)), ("b", (100,)), ("c", (50,))])
    placement = RoundRobin().place(infos, 2)  # a, c on shard 0; b on shard 1
    load = ShardLoad(0, window_s=2.0, pushes=10, bytes_in=14_000, bytes_out=14_000, busy_s=0.5, apply_s=0.35,
                     queue_s=0.2, wait_s=0.9)
    blocks = block_loads(load, placement)
    assert [b.block_id for b in blocks] == [b.block_id for b in placement.blocks_on(0)]
    assert sum(b.apply_s for b in blocks) == pytest.approx(0.35)
    assert sum(b.bytes_in for b in blocks) == 14_000 and sum(b.bytes_out for b in blocks) == 14_000
    big = max(blocks, key=lambda b: b.bytes_in)
    assert big.apply_s == pytest.approx(0.35 * 300 / 350)
    assert all(b.wait_s == 0.9 and b.queue_s == 0.2 and b.pushes == 10 for b in blocks)
