"""Workers reach shards on other Ray nodes over the shards' TCP channels (the same protocol as the same-node
channel): a run gives the parameters, bit for bit, that the run through Ray gives; pieces announced during
backward change no value. (A shard that dies under a TCP channel is a shard loss: test_shm_datapath.py.)"""

from __future__ import annotations

from dataclasses import replace as dataclass_replace

import numpy as np
import pytest
from test_shm_datapath import _run, _run_with_stats, _spec, nodes  # noqa: F401 - nodes: a fixture


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


def test_a_tcp_channel_that_cannot_open_leaves_the_shard_to_ray_and_says_why(nodes, caplog):  # noqa: F811
    import ray

    from cmdare.ps.placement import get_placement
    from cmdare.train.run.run_start import initial_state
    from cmdare.train.workers.worker import Worker

    class UnreachableShard:  # defined here: Ray takes it to the actor by value
        """A shard on another node whose TCP channel cannot be reached (a closed port)."""

        def channel(self):
            return "f" * 56, None

        def tcp_channel(self):
            import socket

            from cmdare.ps.tcp_channel import TcpChannelAddress

            with socket.socket() as s:  # a port nobody listens on
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            return TcpChannelAddress("127.0.0.1", port, b"x" * 32)

    spec = _spec(sync=False, ps=1, workers=1)
    infos, *_ = initial_state(spec, "t", None, None, False)
    shard = ray.remote(UnreachableShard).options(num_cpus=0).remote()
    with caplog.at_level("WARNING", logger="cmdare.train"):
        worker = Worker(0, 0, 1, spec, [shard], get_placement(spec.placement).place(infos, 1), 1, 0, None, 1.0)
    assert worker.data_paths() == {"channel": [], "tcp": [], "ray": [0]}
    assert any("shard 0's TCP channel at 127.0.0.1:" in m and "refused or unreachable" in m
               and "pushes go through Ray" in m for m in (r.getMessage() for r in caplog.records)), caplog.text
    worker.leave()
    ray.kill(shard)
