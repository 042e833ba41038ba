"""A push whose gradient comes in pieces (asynchronous shards): applied piece by piece it gives the
values of one whole push, bit for bit; its step is claimed at the first piece."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.ps.blocks import Block
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.ps.shard_state import PIECE_ALIGN, BlockData, OpenPush, ShardState

CFG = OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=5e-4, schedule="cosine", total_steps=10)


def _state(n: int, max_step: int | None = None, seed: int = 0) -> ShardState:
    rng = np.random.default_rng(seed)
    state = ShardState(0, CFG, max_step)
    state.load(BlockData((Block(0, 0, "p", 0, n),), rng.standard_normal(n).astype(np.float32),
                         rng.standard_normal(n).astype(np.float32), 0))
    return state


@pytest.mark.parametrize("cuts", [[0, 1000, 2003], [0, 7, 500, 1333, 2003], [0, 2003]])
def test_pieces_then_push_equal_one_whole_push_bit_for_bit(cuts):
    n = 2003
    rng = np.random.default_rng(1)
    whole, pieces = _state(n), _state(n)
    out_whole, out_pieces = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for step in range(3):
        grad = rng.standard_normal(n).astype(np.float32)
        assert whole.serve(grad, step, None, out_whole)
        push = pieces.open_push(grad, step)
        assert push is not None and pieces.step == step + 1 and pieces.open_pushes == 1
        for lo, hi in reversed(list(zip(cuts[:-1], cuts[1:], strict=True))):  # backward's order
            assert pieces.apply_piece(push, grad, out_pieces, lo, hi) <= hi - lo
            for a, b in push.applied:  # a piece's parameters are in the worker's memory at once
                assert a % PIECE_ALIGN == 0 and (b % PIECE_ALIGN == 0 or b == n)
                np.testing.assert_array_equal(out_pieces[a:b], pieces.params[a:b])
        assert pieces.serve(grad, step, None, out_pieces, push=push)
        assert pieces.open_pushes == 0
        np.testing.assert_array_equal(pieces.params, whole.params)
        np.testing.assert_array_equal(pieces.momentum, whole.momentum)
        np.testing.assert_array_equal(out_pieces, out_whole)
    assert pieces.step == whole.step == 3
    assert pieces.stats().pushes == 3


def test_a_piece_is_trimmed_to_aligned_ends_and_the_rest_waits_for_the_push():
    state = _state(1000)
    grad = np.ones(1000, np.float32)
    push = state.open_push(grad, 0)
    out = np.zeros(1000, np.float32)
    assert state.apply_piece(push, grad, out, 10, 300) == 256 - 64  # [64, 256)
    assert push.applied == [(64, 256)]
    assert state.apply_piece(push, grad, out, 900, 1000) == 1000 - 960  # the buffer's end needs no trim
    assert push.rest(1000) == [(0, 64), (256, 960)]
    assert np.all(out[:64] == 0) and np.all(out[64:256] != 0) and np.all(out[256:960] == 0)
    state.close_push(push, grad, out)
    np.testing.assert_array_equal(out, state.params)


def test_the_step_is_claimed_at_the_first_piece_so_a_budget_is_never_overrun():
    state = _state(256, max_step=2)
    grad = np.ones(256, np.float32)
    first, second = state.open_push(grad, 0), state.open_push(grad, 0)
    assert first is not None and second is not None and state.done
    assert state.open_push(grad, 0) is None  # the budget is claimed: a third push is refused
    assert not state.serve(grad, 0, None)  # and so is a whole one
    state.apply_piece(first, grad, np.zeros(256, np.float32), 0, 128)
    state.close_push(first, grad, None)
    state.abandon_push(second)  # its worker went away: the claim stays
    assert state.open_pushes == 0 and state.step == 2


def test_a_stale_layout_refuses_pieces_and_the_open_push_is_released():
    state = _state(256)
    with pytest.raises(ValueError, match="gradient of 100"):
        state.open_push(np.ones(100, np.float32), 0)
    push = state.open_push(np.ones(256, np.float32), 0)
    with pytest.raises(ValueError, match="stale"):
        state.serve(np.ones(256, np.float32), 0, None, np.zeros(10, np.float32), push=push)
    assert state.open_pushes == 0


def test_rest_of_an_open_push():
    push = OpenPush(0.1, [(64, 128), (0, 64), (192, 256)])
    assert push.rest(300) == [(128, 192), (256, 300)]
    assert OpenPush(0.1).rest(5) == [(0, 5)]
