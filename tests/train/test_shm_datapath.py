"""Workers reach shards on their own Ray node through the shared-memory channel, others through Ray.

Both paths run the same shard code, so a run must give the same parameters, bit for bit, whichever path
each push took; a shard that dies under a channel is reported as Ray reports a dead shard.
"""

from __future__ import annotations

import time
from dataclasses import replace as dataclass_replace

import numpy as np
import pytest

from cmdare.errors import ShardLostError
from cmdare.ps.blocks import Block
from cmdare.ps.channel import ChannelClient, SharedHostMemory, channels_enabled
from cmdare.ps.layout import model_flat_from_shard_arrays, shard_arrays_from_model_flat
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.ps.placement import get_placement
from cmdare.ps.shard import AsyncShardActor, BlockData, SyncShardActor
from cmdare.ps.shard_state import ShardState
from cmdare.train.run.run_start import initial_state
from cmdare.train.runtime.faults import classify
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.worker import Worker

pytestmark = pytest.mark.skipif(not channels_enabled(), reason="needs Linux memfd and fd passing")

OPT = OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=5e-4)
OFF = {"runtime_env": {"env_vars": {"CMDARE_SHM": "0", "CMDARE_TCP": "0"}}}
NO_TCP = {"runtime_env": {"env_vars": {"CMDARE_TCP": "0"}}}  # these tests compare the same-node channel with Ray


def _on(node_id: str) -> dict:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


@pytest.fixture(scope="module")
def nodes(cluster):
    """The head node's id and a second node's (1 CPU) of the module's local cluster."""
    import ray

    head = ray.get_runtime_context().get_node_id()
    other = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    return head, other.node_id


def _run(spec: TrainSpec, shard_nodes: list[str], worker_node: str, channels: bool, steps: int, tcp: bool = False):
    """Shards on ``shard_nodes``, ``spec.workers`` workers on ``worker_node``; ``steps`` steps each (sync: all
    together); ``channels``: the same-node channel (and, with ``tcp``, the TCP one to other nodes); returns
    (final model-order parameters, each worker's data paths)."""
    flat, paths, _ = _run_full(spec, shard_nodes, worker_node, channels, steps, tcp)
    return flat, paths


def _run_with_stats(spec: TrainSpec, shard_nodes: list[str], worker_node: str, steps: int, tcp: bool = False):
    """(final parameters, pieces each shard was announced, pieces it applied on arrival, the workers' data
    paths) of a run."""
    flat, paths, stats = _run_full(spec, shard_nodes, worker_node, True, steps, tcp)
    return flat, [s.pieces for s in stats], [s.pieces_applied for s in stats], paths


def _run_full(spec: TrainSpec, shard_nodes: list[str], worker_node: str, channels: bool, steps: int,
              tcp: bool = False):
    import ray

    infos, params, momentum, *_ = initial_state(spec, "t", None, None, False)
    placement = get_placement(spec.placement).place(infos, spec.ps)
    env = OFF if not channels else {} if tcp else NO_TCP
    if spec.ps_bandwidth:
        link = spec.ps_link_bytes_per_s()
    if spec.sync:
        shards = [ray.remote(SyncShardActor).options(num_cpus=0, **_on(n), **env).remote(k, OPT, None, spec.workers)
                  for k, n in enumerate(shard_nodes)]
    else:
        shards = [ray.remote(AsyncShardActor).options(num_cpus=0, **_on(n), **env).remote(k, OPT)
                  for k, n in enumerate(shard_nodes)]
    values = shard_arrays_from_model_flat(params, infos, placement)
    moms = shard_arrays_from_model_flat(momentum, infos, placement)
    ray.get([s.load.remote(BlockData(tuple(placement.blocks_on(k)), values[k], moms[k], 0))
             for k, s in enumerate(shards)])
    if spec.ps_bandwidth:
        ray.get([s.set_link.remote(link) for s in shards])
    workers = [ray.remote(Worker).options(num_cpus=0, **_on(worker_node), **env).remote(
        w, w, spec.workers, spec, shards, placement, 1, 0, None, 1.0) for w in range(spec.workers)]
    paths = ray.get([w.data_paths.remote() for w in workers])
    if spec.sync:
        ray.get([w.run_steps.remote(steps, 600.0) for w in workers])
    else:  # one worker at a time: the order of pushes is fixed
        for _ in range(steps):
            for w in workers:
                ray.get(w.run_steps.remote(1, 600.0))
    snaps = ray.get([s.snapshot.remote() for s in shards])
    stats = ray.get([s.stats.remote() for s in shards])
    flat = model_flat_from_shard_arrays([s.blocks for s in snaps], [s.params for s in snaps], infos)
    for a in workers + shards:
        ray.kill(a)
    return flat, paths, stats


def _spec(**kw) -> TrainSpec:
    base = dict(model="resnet8", dataset="digits", workers=2, ps=2, steps=1000, batch_size=16, sync=True,
                optimizer=OPT, eval_every=0, seed=3)
    base.update(kw)
    return TrainSpec(**base)


def test_sync_run_with_one_shard_on_the_workers_node_equals_the_run_through_ray(nodes):
    head, other = nodes
    spec = _spec()
    fast, paths = _run(spec, [head, other], head, channels=True, steps=6)
    assert paths == [{"channel": [0], "tcp": [], "ray": [1]}] * 2  # the shard on the workers' node by the channel
    plain, paths_off = _run(spec, [head, other], head, channels=False, steps=6)
    assert paths_off == [{"channel": [], "tcp": [], "ray": [0, 1]}] * 2
    np.testing.assert_array_equal(fast, plain)


def test_async_run_through_channels_equals_the_run_through_ray(nodes):
    head, _ = nodes
    spec = _spec(sync=False, ps=2)
    fast, paths = _run(spec, [head, head], head, channels=True, steps=5)
    assert paths == [{"channel": [0, 1], "tcp": [], "ray": []}] * 2
    plain, _ = _run(spec, [head, head], head, channels=False, steps=5)
    np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("path", ["channel", "tcp"])
def test_a_shard_that_dies_under_a_channel_is_a_shard_loss(nodes, path):
    """On the same node (the shared-memory channel) or another (the TCP channel), as through Ray."""
    import ray

    head, other = nodes
    spec = _spec(sync=False, ps=1, workers=1)
    infos, params, momentum, *_ = initial_state(spec, "t", None, None, False)
    placement = get_placement(spec.placement).place(infos, 1)
    shard = ray.remote(AsyncShardActor).options(num_cpus=0, **_on(head if path == "channel" else other)).remote(0, OPT)
    ray.get(shard.load.remote(BlockData(tuple(placement.blocks_on(0)), params, momentum, 0)))
    worker = ray.remote(Worker).options(num_cpus=0, **_on(head)).remote(0, 0, 1, spec, [shard], placement, 1, 0,
                                                                         None, 1.0)
    assert ray.get(worker.data_paths.remote()) == {"channel": [], "tcp": [], "ray": [], path: [0]}
    assert ray.get(worker.run_steps.remote(3, 60.0)).steps == 3
    ray.kill(shard)
    with pytest.raises(ray.exceptions.RayActorError) as err:
        ray.get(worker.run_steps.remote(3, 60.0), timeout=120)
    assert isinstance(classify(err.value, 0), ShardLostError)
    ray.kill(worker)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_pieces_sent_through_ray_to_another_node_change_no_value(nodes, sync):
    """Shards on another node get the gradient's pieces as Ray calls during backward (staged there: their
    link time passes during backward); the rest goes with the push, which applies the whole gradient: the
    same values, bit for bit, as one push after backward."""
    head, other = nodes
    spec = _spec(sync=sync, ps=2, workers=2 if sync else 1, ps_bandwidth="400MB/s")
    overlapped = _run_with_stats(spec, [other, other], head, steps=4)
    after = _run_with_stats(dataclass_replace(spec, overlap=False), [other, other], head, steps=4)
    assert overlapped[3] == [{"channel": [], "tcp": [], "ray": [0, 1]}] * spec.workers
    np.testing.assert_array_equal(overlapped[0], after[0])
    assert after[1] == [0, 0] and after[2] == [0, 0]
    assert all(n >= 4 * spec.workers for n in overlapped[1])
    assert overlapped[2] == [0, 0]  # through Ray nothing is applied before the push


def test_pieces_through_ray_are_staged_so_a_snapshot_meanwhile_needs_no_wait(nodes):
    """An asynchronous shard runs one Ray call at a time: a snapshot between a worker's pieces and its push
    must not wait for that push (it is queued behind the snapshot), so pieces through Ray are only staged."""
    import ray

    head, _ = nodes
    n = 4096
    start = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    shard = ray.remote(AsyncShardActor).options(num_cpus=0, **_on(head)).remote(0, OPT)
    ray.get(shard.load.remote(BlockData((Block(0, 0, "p", 0, n),), start, np.zeros(n, np.float32), 0)))
    grad = np.linspace(-1, 1, n, dtype=np.float32)
    piece = shard.push_piece.remote(7, n // 2, grad[n // 2:], n, 0, 0)
    snap = ray.get(shard.snapshot.remote(), timeout=30)
    assert ray.get(piece) is None
    assert snap.step == 0
    np.testing.assert_array_equal(snap.params, start)
    params, step, applied = ray.get(shard.push_rest.remote(7, 1, [(0, n // 2)], grad[:n // 2], n, 0, None, 0))
    assert (step, applied) == (1, True)
    expected = ShardState(0, OPT)
    expected.load(BlockData((Block(0, 0, "p", 0, n),), start, np.zeros(n, np.float32), 0))
    expected.apply(grad)
    np.testing.assert_array_equal(params, expected.params)
    with pytest.raises(ray.exceptions.RayTaskError, match="came after 0 of its 1 pieces"):
        ray.get(shard.push_rest.remote(7, 1, [(0, n // 2)], grad[:n // 2], n, 1, None, 0))
    ray.kill(shard)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_pieces_announced_during_backward_change_no_value(nodes, sync):
    """With an emulated link the gradient's pieces go to the shards while backward runs (an asynchronous
    shard applies them at once and writes their parameters back); the update is the same, bit for bit,
    as when the whole gradient is pushed after backward."""
    head, _ = nodes
    spec = _spec(sync=sync, ps=2, workers=2 if sync else 1, ps_bandwidth="400MB/s")
    overlapped = _run_with_stats(spec, [head, head], head, steps=4)
    after = _run_with_stats(dataclass_replace(spec, overlap=False), [head, head], head, steps=4)
    np.testing.assert_array_equal(overlapped[0], after[0])
    assert after[1] == [0, 0] and after[2] == [0, 0]
    assert all(n >= 4 * spec.workers for n in overlapped[1])  # at least a piece per shard per push
    if sync:  # a round's update needs every worker's gradient
        assert overlapped[2] == [0, 0]
    else:
        assert all(n >= 4 for n in overlapped[2])


def test_a_snapshot_waits_for_a_push_whose_pieces_are_being_applied(nodes):
    """An asynchronous shard applies a piece on arrival; a snapshot taken before the push completes the step
    waits for it (a checkpoint never holds half a step), and a channel that closes mid-push releases it."""
    import ray

    head, _ = nodes
    n = 4096
    rng = np.random.default_rng(0)
    start = rng.standard_normal(n).astype(np.float32)
    shard = ray.remote(AsyncShardActor).options(num_cpus=0, max_concurrency=4, **_on(head)).remote(0, OPT)
    ray.get(shard.load.remote(BlockData((Block(0, 0, "p", 0, n),), start, np.zeros(n, np.float32), 0)))
    _, address = ray.get(shard.channel.remote())
    memory = SharedHostMemory(n)
    client = ChannelClient(address, memory, 0, n)
    memory.grads[:] = 1.0
    client.send_piece(n // 2, n // 2, 0, 0)  # the second half is final: applied at once
    deadline = time.monotonic() + 30
    while ray.get(shard.stats.remote(reset=False)).pieces_applied == 0:
        assert time.monotonic() < deadline
    assert np.all(memory.params.numpy()[n // 2:] != 0) and np.all(memory.params.numpy()[:n // 2] == 0)
    snap = shard.snapshot.remote()
    ready, _ = ray.wait([snap], timeout=1.0)
    assert not ready  # half a step is applied: the snapshot waits
    client.send(0, None, 0, sent=n // 2)
    assert client.receive() == (1, True)
    taken = ray.get(snap, timeout=30)
    assert taken.step == 1
    np.testing.assert_array_equal(taken.params, memory.params.numpy())
    expected = ShardState(0, OPT)  # the same update made in one piece, off Ray
    expected.load(BlockData((Block(0, 0, "p", 0, n),), start, np.zeros(n, np.float32), 0))
    expected.apply(np.ones(n, np.float32))
    np.testing.assert_array_equal(taken.params, expected.params)
    applied = ray.get(shard.stats.remote(reset=False)).pieces_applied
    client.send_piece(0, n, 1, 0)  # a push opened, then its worker goes away
    while ray.get(shard.stats.remote(reset=False)).pieces_applied == applied:  # the shard has it (on a loaded
        assert time.monotonic() < deadline + 30  # machine a snapshot can arrive first, and rightly not wait)
    client.close()
    assert ray.get(shard.snapshot.remote(), timeout=30).step == 2  # released: its claim and piece stay
    ray.kill(shard)


def test_a_local_process_without_the_secret_cannot_touch_a_running_shard(nodes):
    """Issue 29's probe against a real shard actor: a process that finds the channel's name (it is listed
    in /proc/net/unix) and pushes a NaN gradient without the channel's secret is refused; the shard's
    parameters and step stay bit-identical, and a worker with the secret (from Ray) is served."""
    import ray

    from cmdare.ps.channel import ChannelAddress, ChannelRefused

    head, _ = nodes
    n = 1024
    start = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    shard = ray.remote(AsyncShardActor).options(num_cpus=0, max_concurrency=4, **_on(head)).remote(0, OPT)
    ray.get(shard.load.remote(BlockData((Block(0, 0, "p", 0, n),), start, np.zeros(n, np.float32), 0)))
    _, address = ray.get(shard.channel.remote())
    with open("/proc/net/unix") as f:
        assert any(line.rstrip().endswith("@" + address.name) for line in f)
    memory = SharedHostMemory(n)
    memory.grads[:] = float("nan")
    for guess in (b"", b"\0" * 32):
        with pytest.raises(ChannelRefused):
            ChannelClient(ChannelAddress(address.name, guess), memory, 0, n)
    taken = ray.get(shard.snapshot.remote(), timeout=30)
    assert taken.step == 0 and taken.params.tobytes() == start.tobytes()
    memory.grads[:] = 0.0
    client = ChannelClient(address, memory, 0, n)
    client.send(0, None, 0)
    assert client.receive() == (1, True)
    client.close()
    ray.kill(shard)
