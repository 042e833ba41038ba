"""The chunked shard update is bit-identical to whole-buffer torch ops and keeps its scratch small."""

import numpy as np
import pytest
import torch

from cmdare.ps.blocks import Block
from cmdare.ps.optimizer import UPDATE_CHUNK_ELEMS, OptimizerConfig, sgd_update
from cmdare.ps.shard import BlockData, ShardState


def _whole_buffer_update(param, grad, buf, lr, cfg):
    """The update as whole-buffer torch ops, in torch.optim.SGD's order (the reference)."""
    p, d_p = torch.from_numpy(param), torch.from_numpy(grad.copy())
    if cfg.weight_decay:
        d_p = d_p.add(p, alpha=cfg.weight_decay)
    if cfg.momentum:
        b = torch.from_numpy(buf)
        b.mul_(cfg.momentum).add_(d_p)
        d_p = d_p.add(b, alpha=cfg.momentum) if cfg.nesterov else b
    p.add_(d_p, alpha=-lr)


@pytest.mark.parametrize("cfg", [
    OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=5e-4),
    OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True),
    OptimizerConfig(lr=0.05, momentum=0.0, weight_decay=1e-4),
    OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=0.0),
])
@pytest.mark.parametrize("n, scratch_elems", [(10_007, 1000), (10_007, 16), (UPDATE_CHUNK_ELEMS + 123, None)])
def test_chunked_update_is_bit_identical(cfg, n, scratch_elems):
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(n).astype(np.float32)
    p_ref, b_ref = p0.copy(), np.zeros(n, np.float32)
    p, b = p0.copy(), np.zeros(n, np.float32)
    scratch = None if scratch_elems is None else np.empty(scratch_elems, np.float32)
    for _ in range(4):
        g = rng.standard_normal(n).astype(np.float32)
        g.flags.writeable = False  # as when it arrives zero-copy from Ray's object store
        _whole_buffer_update(p_ref, g, b_ref, cfg.lr, cfg)
        out = np.full(n, np.nan, np.float32)  # a same-node worker's parameter memory
        sgd_update(p, g, b, cfg.lr, cfg, scratch, out)
        np.testing.assert_array_equal(out, p)  # every chunk copied out as it was updated
    np.testing.assert_array_equal(p, p_ref)
    np.testing.assert_array_equal(b, b_ref)
    assert not np.array_equal(p, p0)


CONFIGS = [
    OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=5e-4),
    OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True),
    OptimizerConfig(lr=0.05, momentum=0.0, weight_decay=1e-4),
]


def _torch_sgd(p0: np.ndarray, cfg: OptimizerConfig) -> tuple[torch.Tensor, torch.optim.SGD]:
    p = torch.tensor(p0, requires_grad=True)
    return p, torch.optim.SGD([p], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                              nesterov=cfg.nesterov)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_first_step_equals_torch_sgd_exactly(cfg):
    """Promised exactly (optimizer.py): the zero momentum buffer's first update ``0 * momentum + d_p``
    equals torch's first-step ``buf = d_p``, so the first step is torch.optim.SGD's, bit for bit."""
    rng = np.random.default_rng(2)
    n = 10_007
    p0, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    p, sgd = _torch_sgd(p0, cfg)
    p.grad = torch.from_numpy(g.copy())
    sgd.step()
    ours, buf = p0.copy(), np.zeros(n, np.float32)
    g.flags.writeable = False
    sgd_update(ours, g, buf, cfg.lr, cfg, np.empty(1000, np.float32))
    np.testing.assert_array_equal(ours, p.detach().numpy())
    if cfg.momentum:
        np.testing.assert_array_equal(buf, sgd.state[p]["momentum_buffer"].numpy())


@pytest.mark.parametrize("cfg", CONFIGS)
def test_steps_with_a_changing_lr_follow_torch_sgd(cfg):
    """Six steps with the lr changed between them (as a schedule does) track torch.optim.SGD to float
    tolerance (only the first step is promised exactly)."""
    rng = np.random.default_rng(3)
    n = 5_003
    p0 = rng.standard_normal(n).astype(np.float32)
    p, sgd = _torch_sgd(p0, cfg)
    ours, buf = p0.copy(), np.zeros(n, np.float32)
    for t in range(6):
        lr = cfg.lr * (0.5 ** (t // 2))
        g = rng.standard_normal(n).astype(np.float32)
        for group in sgd.param_groups:
            group["lr"] = lr
        p.grad = torch.from_numpy(g.copy())
        sgd.step()
        sgd_update(ours, g, buf, lr, cfg)
    np.testing.assert_allclose(ours, p.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_shard_scratch_is_one_chunk_not_a_shard_copy():
    n = 3 * UPDATE_CHUNK_ELEMS + 5
    state = ShardState(0, OptimizerConfig())
    state.load(BlockData((Block(0, 0, "w", 0, n),), np.ones(n, np.float32), np.zeros(n, np.float32), 0))
    assert state._scratch.nbytes == UPDATE_CHUNK_ELEMS * 4
    small = ShardState(1, OptimizerConfig())
    small.load(BlockData((Block(0, 0, "w", 0, 10),), np.ones(10, np.float32), np.zeros(10, np.float32), 0))
    assert small._scratch.size == 10
    assert state.apply(np.full(n, 0.5, np.float32)) and state.step == 1
    np.testing.assert_allclose(state.params, 1.0 - OptimizerConfig().lr * (0.5 + 1e-4), rtol=1e-6)
