"""Any torch.optim optimizer on the shards (``--optimizer adamw`` with a PS): the update equals torch's on the model,
and its state moves, snapshots and converts to the checkpoint's layout with the blocks, exactly. No Ray."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cmdare.errors import UserInputError
from cmdare.ps.blocks import param_infos, split_blocks
from cmdare.ps.layout import model_optimizer_state, shard_arrays_from_model_flat, shard_optimizer_state
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.ps.placement import Placement, RoundRobin
from cmdare.ps.shard import BlockData, ShardState
from cmdare.ps.shard_optimizer import shard_optimizer
from cmdare.train.allreduce.optimizer_state import optimizer_arrays

CFG = OptimizerConfig(lr=1e-2, weight_decay=1e-2)
SHAPES = [("a", (3, 4)), ("b", (5,)), ("c", (2, 2)), ("d", (7,)), ("e", (70,))]


def _grads(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _shards(placement: Placement, flat: np.ndarray, name: str = "adamw") -> list[ShardState]:
    infos = param_infos(SHAPES)
    values = shard_arrays_from_model_flat(flat, infos, placement)
    states = []
    for k in range(placement.num_shards):
        st = ShardState(k, CFG, optimizer=name)
        st.load(BlockData(tuple(placement.blocks_on(k)), values[k], np.zeros_like(values[k]), 0))
        states.append(st)
    return states


def _torch_run(flat: np.ndarray, grads: list[np.ndarray], cls=torch.optim.AdamW):
    """torch's optimizer on the model's own parameter tensors."""
    infos = param_infos(SHAPES)
    params, at = [], 0
    for info in infos:
        params.append(torch.nn.Parameter(torch.from_numpy(flat[at:at + info.numel].copy()).view(info.shape)))
        at += info.numel
    opt = cls(params, lr=CFG.lr, weight_decay=CFG.weight_decay)
    for g in grads:
        at = 0
        for p in params:
            p.grad = torch.from_numpy(g[at:at + p.numel()].copy()).view_as(p)
            at += p.numel()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in params]).numpy(), opt, params


def _model_flat(states: list[ShardState]) -> np.ndarray:
    from cmdare.ps.layout import model_flat_from_shard_arrays

    return model_flat_from_shard_arrays([s.blocks for s in states], [s.params for s in states], param_infos(SHAPES))


def _push(states: list[ShardState], placement: Placement, grad: np.ndarray) -> None:
    parts = shard_arrays_from_model_flat(grad, param_infos(SHAPES), placement)
    for st, g in zip(states, parts, strict=True):
        assert st.apply(g)


@pytest.mark.parametrize("name, cls", [("adamw", torch.optim.AdamW), ("torch.optim:Adagrad", torch.optim.Adagrad),
                                       ("torch.optim:RMSprop", torch.optim.RMSprop)])
def test_blocks_moved_between_shards_mid_run_train_on_as_torch_does(name, cls):
    """Three shards run the optimizer on their blocks; after 4 steps two blocks move (their state with them) and 4
    more steps follow: the model equals torch's optimizer on the whole model, and its state too (exact)."""
    rng = np.random.default_rng(1)
    infos = param_infos(SHAPES)
    flat = rng.standard_normal(sum(i.numel for i in infos)).astype(np.float32)
    grads = [_grads(rng, flat.size) for _ in range(8)]
    placement = RoundRobin().place(infos, 3)
    states = _shards(placement, flat, name)
    for g in grads[:4]:
        _push(states, placement, g)
    moves = {1: 2, 4: 0}  # block 1 from shard 1 to shard 2, block 4 from shard 1 to shard 0
    for block, dst in moves.items():
        states[dst].add(states[placement.shard_of_block(block)].take({block}))
    placement = placement.moved(moves)
    for g in grads[4:]:
        _push(states, placement, g)
    want, opt, params = _torch_run(flat, grads, cls)
    np.testing.assert_array_equal(_model_flat(states), want)
    state = model_optimizer_state([s.blocks for s in states], [s.snapshot().optimizer for s in states], infos)
    expected = optimizer_arrays(opt, params)[1]
    assert sorted(state) == sorted(expected)
    for key, values in expected.items():
        np.testing.assert_array_equal(state[key], values, err_msg=key)


def test_a_block_that_joins_without_state_steps_on_its_own_as_torch_does():
    """A block added without optimizer state (a parameter that had no gradient yet) is stepped as its own tensor
    while the shard's other blocks are at another step: each as torch's AdamW on the model, where that parameter's
    gradient was None until it joined (exact)."""
    rng = np.random.default_rng(4)
    infos = param_infos(SHAPES)
    flat = rng.standard_normal(sum(i.numel for i in infos)).astype(np.float32)
    grads = [_grads(rng, flat.size) for _ in range(6)]
    placement = RoundRobin().place(infos, 1)
    late = placement.blocks[-1]  # "e": no gradient for the first 3 steps
    (shard,) = _shards(placement, flat)
    joined = shard.take({late.block_id})
    joined = BlockData(joined.blocks, joined.params, joined.momentum, joined.step)  # no optimizer state
    early = slice(0, flat.size - late.size)
    for g in grads[:3]:
        shard.apply(g[early])
    shard.add(joined)
    for g in grads[3:]:
        shard.apply(g)
    assert list(shard.slots.scalars["step"]) == [6.0] * (len(placement.blocks) - 1) + [3.0]
    params = [torch.nn.Parameter(torch.from_numpy(flat[a:b].copy())) for a, b in
              zip(np.cumsum([0] + [i.numel for i in infos])[:-1], np.cumsum([i.numel for i in infos]), strict=True)]
    opt = torch.optim.AdamW(params, lr=CFG.lr, weight_decay=CFG.weight_decay)
    for k, g in enumerate(grads):
        at = 0
        for i, p in enumerate(params):
            p.grad = None if (k < 3 and i == len(params) - 1) else torch.from_numpy(g[at:at + p.numel()].copy())
            at += p.numel()
        opt.step()
    np.testing.assert_array_equal(shard.params, torch.cat([p.detach() for p in params]).numpy())


def test_the_checkpoint_layout_round_trips_through_blocks_split_over_shards():
    """A checkpoint's optimizer arrays (model order) cut into split blocks on 3 shards and gathered back: exact;
    a block the optimizer never updated keeps no state."""
    rng = np.random.default_rng(2)
    infos = param_infos(SHAPES)
    flat = rng.standard_normal(sum(i.numel for i in infos)).astype(np.float32)
    _, opt, params = _torch_run(flat, [_grads(rng, flat.size) for _ in range(3)])
    arrays = optimizer_arrays(opt, params)[1]
    blocks = split_blocks(infos, max_block_elems=8)  # "e" (70 values) is 9 blocks
    placement = Placement(tuple(blocks), tuple(i % 3 for i in range(len(blocks))), 3)
    optimizer = shard_optimizer("adamw", CFG)
    slots = shard_optimizer_state(arrays, infos, placement, optimizer)
    back = model_optimizer_state([placement.blocks_on(k) for k in range(3)], slots, infos)
    assert sorted(back) == sorted(arrays)
    for key, values in arrays.items():
        np.testing.assert_array_equal(back[key], values, err_msg=key)
    fresh = shard_optimizer_state({}, infos, placement, optimizer)
    assert fresh == [None, None, None]
    with pytest.raises(ValueError, match="not --optimizer torch.optim:Adagrad's"):
        shard_optimizer_state(arrays, infos, placement, shard_optimizer("torch.optim:Adagrad", CFG))


def test_pieces_wait_for_the_push_and_the_whole_update_is_applied_then():
    """Pieces a worker sends during backward are not applied early by an optimizer that updates blocks whole: the
    push applies all of them, as one step."""
    rng = np.random.default_rng(3)
    infos = param_infos(SHAPES)
    flat = rng.standard_normal(sum(i.numel for i in infos)).astype(np.float32)
    placement = RoundRobin().place(infos, 1)
    (early,), (whole,) = _shards(placement, flat), _shards(placement, flat)
    g = _grads(rng, flat.size)
    out = np.zeros_like(flat)
    push = early.open_push(g, None)
    assert push is not None and early.apply_piece(push, g, out, 0, 64) == 0
    early.close_push(push, g, out)
    whole.apply(g)
    np.testing.assert_array_equal(early.params, whole.params)
    np.testing.assert_array_equal(out, whole.params)


@pytest.mark.parametrize("name, says", [("torch.optim:LBFGS", "cannot step on a parameter shard's block"),
                                        ("lion", "not one of sgd, adamw")])
def test_an_optimizer_a_shard_cannot_run_is_refused_in_words(name, says):
    with pytest.raises(UserInputError, match=says):
        shard_optimizer(name, CFG)
