"""A synchronous shard's round size follows the coordinator's changes in the order it made them, even when
Ray delivers them out of order (an async actor's calls are not kept in submission order)."""

from __future__ import annotations

import numpy as np

from cmdare.ps.blocks import Block
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.ps.shard import BlockData, SyncShardActor

OPT = OptimizerConfig(lr=0.5, momentum=0.0, weight_decay=0.0)


def _shard(ray, num_workers: int):
    shard = ray.remote(SyncShardActor).options(num_cpus=0).remote(0, OPT, None, num_workers)
    block = Block(0, 0, "w", 0, 4)
    ray.get(shard.load.remote(BlockData((block,), np.ones(4, np.float32), np.zeros(4, np.float32), 0)))
    return shard


def test_an_older_round_size_arriving_late_is_ignored(local_ray):
    ray = local_ray
    shard = _shard(ray, 2)
    # a loss shrank the round (epoch 1), the replacement grew it back (epoch 2); the shrink arrives last
    ray.get(shard.set_num_workers.remote(2, 2))
    ray.get(shard.set_num_workers.remote(1, 1))
    first = shard.push_pull.remote(np.full(4, 1.0, np.float32), 0, None, 0)
    ready, _ = ray.wait([first], timeout=1.0)
    assert not ready  # the round still waits for a second worker's push
    second = shard.push_pull.remote(np.full(4, 3.0, np.float32), 0, None, 1)
    (p1, s1, a1), (p2, s2, a2) = ray.get([first, second])
    assert a1 and a2 and s1 == s2 == 1  # one round of both pushes
    np.testing.assert_array_equal(p1, np.full(4, 1.0 - 0.5 * 2.0, np.float32))  # the mean gradient, once
    np.testing.assert_array_equal(p1, p2)
    ray.kill(shard)


def test_round_size_changes_in_order_still_apply(local_ray):
    ray = local_ray
    shard = _shard(ray, 2)
    ray.get(shard.set_num_workers.remote(1, 1))  # a worker left
    params, step, applied = ray.get(shard.push_pull.remote(np.full(4, 2.0, np.float32), 0, None, 0))
    assert applied and step == 1
    np.testing.assert_array_equal(params, np.zeros(4, np.float32))
    # the same epoch again (a resend to every shard after a placement change) applies; an unnumbered call too
    ray.get(shard.set_num_workers.remote(1, 1))
    ray.get(shard.set_num_workers.remote(3))
    first = shard.push_pull.remote(np.full(4, 2.0, np.float32), 1, None, 0)
    assert not ray.wait([first], timeout=0.5)[0]
    ray.get(shard.set_num_workers.remote(1, 2))  # shrinking completes the waiting round
    assert ray.get(first)[1] == 2
    ray.kill(shard)
