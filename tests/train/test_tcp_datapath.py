"""Workers reach shards on other Ray nodes over the shards' TCP channels (the same protocol as the same-node
channel): a run gives the parameters, bit for bit, that the run through Ray gives; pieces announced during
backward change no value; a shard that dies under a TCP channel is a shard loss; a channel that cannot be
opened leaves the shard to Ray, with the reason logged."""

from __future__ import annotations

from dataclasses import replace as dataclass_replace

import numpy as np
import pytest
from test_shm_datapath import OPT, _on, _run, _run_with_stats, _spec, nodes  # noqa: F401 - nodes: a fixture

from cmdare.errors import ShardLostError
from cmdare.ps.placement import get_placement
from cmdare.ps.shard import AsyncShardActor, BlockData
from cmdare.train.faults import classify
from cmdare.train.setup import initial_state
from cmdare.train.worker import Worker


def test_sync_run_over_tcp_and_the_same_node_channel_equals_the_run_through_ray(nodes):  # noqa: F811
    head, other = nodes
    spec = _spec()
    fast, paths = _run(spec, [head, other], head, channels=True, steps=6, tcp=True)
    assert paths == [{"channel": [0], "tcp": [1], "ray": []}] * 2
    plain, paths_off = _run(spec, [head, other], head, channels=False, steps=6)
    assert paths_off == [{"channel": [], "tcp": [], "ray": [0, 1]}] * 2
    np.testing.assert_array_equal(fast, plain)


def test_async_run_over_tcp_equals_the_run_through_ray(nodes):  # noqa: F811
    head, other = nodes
    spec = _spec(sync=False, ps=2)
    fast, paths = _run(spec, [other, other], head, channels=True, steps=5, tcp=True)
    assert paths == [{"channel": [], "tcp": [0, 1], "ray": []}] * 2
    plain, _ = _run(spec, [other, other], head, channels=False, steps=5)
    np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_pieces_over_tcp_change_no_value(nodes, sync):  # noqa: F811
    """With an emulated link the gradient's pieces stream to the other node's shards during backward (an
    asynchronous shard applies them on arrival): the same values, bit for bit, as one push after backward."""
    head, other = nodes
    spec = _spec(sync=sync, ps=2, workers=2 if sync else 1, ps_bandwidth="400MB/s")
    overlapped = _run_with_stats(spec, [other, other], head, steps=4, tcp=True)
    after = _run_with_stats(dataclass_replace(spec, overlap=False), [other, other], head, steps=4, tcp=True)
    assert overlapped[3] == [{"channel": [], "tcp": [0, 1], "ray": []}] * spec.workers
    np.testing.assert_array_equal(overlapped[0], after[0])
    assert after[1] == [0, 0] and all(n >= 4 * spec.workers for n in overlapped[1])
    if sync:  # a round's update needs every worker's gradient
        assert overlapped[2] == [0, 0]
    else:  # applied on arrival, as over the same-node channel
        assert all(n >= 4 for n in overlapped[2])


def test_a_shard_that_dies_under_a_tcp_channel_is_a_shard_loss(nodes):  # noqa: F811
    import ray

    head, other = nodes
    spec = _spec(sync=False, ps=1, workers=1)
    infos, params, momentum, _, _ = initial_state(spec, "t", None, None, False)
    placement = get_placement(spec.placement).place(infos, 1)
    shard = ray.remote(AsyncShardActor).options(num_cpus=0, **_on(other)).remote(0, OPT)
    ray.get(shard.load.remote(BlockData(tuple(placement.blocks_on(0)), params, momentum, 0)))
    worker = ray.remote(Worker).options(num_cpus=0, **_on(head)).remote(0, 0, 1, spec, [shard], placement, 1, 0,
                                                                         None, 1.0)
    assert ray.get(worker.data_paths.remote()) == {"channel": [], "tcp": [0], "ray": []}
    assert ray.get(worker.run_steps.remote(3, 60.0)).steps == 3
    ray.kill(shard)
    with pytest.raises(ray.exceptions.RayActorError) as err:
        ray.get(worker.run_steps.remote(3, 60.0), timeout=120)
    assert isinstance(classify(err.value, 0), ShardLostError)
    ray.kill(worker)
