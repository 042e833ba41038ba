"""A worker node's raylet prestarts its worker processes with torch and cmdare imported
(:data:`cmdare.cloud.detection.WORKER_PRESTART_ENV`): the actor a replacement places there finds them imported."""

from __future__ import annotations

import pytest

from cmdare.cloud.detection import PRELOADED_MODULES, WORKER_PRESTART_ENV
from cmdare.cloud.local import LocalClusterProvider
from cmdare.cloud.servers import ServerSpec

pytestmark = pytest.mark.cluster  # make test-cluster: a worker node of a local multi-node cluster


def test_an_actor_on_a_worker_node_finds_torch_and_cmdare_imported(cluster, tmp_path):
    import ray

    class Imported:  # defined here: Ray ships it by value (a test module is not importable on a worker)
        """Which modules the process had imported when this actor was created in it (before anything of its own)."""

        def __init__(self, names: tuple[str, ...]):
            import os
            import sys

            self.found = {name: name in sys.modules for name in names}
            self.pid = os.getpid()

        def report(self) -> tuple[dict[str, bool], int]:
            return self.found, self.pid

    provider = LocalClusterProvider(cluster, scratch_root=tmp_path / "nodes")
    server = provider.request(ServerSpec("K80", "gcp", "us-east1", True, 0.1))
    provider.prepare(server)
    actor = ray.remote(Imported).options(**provider.actor_options(server), num_cpus=1).remote(PRELOADED_MODULES)
    found, pid = ray.get(actor.report.remote(), timeout=120)
    assert found == {"torch": True, "cmdare.train.workers.warm_pool": True}
    # the head node's processes are started as Ray's default: nothing imported before they are given work
    head = ray.remote(Imported).options(num_cpus=0, resources={"cmdare_ps": 1}).remote(PRELOADED_MODULES)
    head_found, head_pid = ray.get(head.report.remote(), timeout=120)
    assert head_pid != pid and not head_found["cmdare.train.workers.warm_pool"]
    provider.release(server)
    assert WORKER_PRESTART_ENV["RAY_preload_python_modules"].split(",") == list(PRELOADED_MODULES)


def test_ready_nodes_wait_for_the_next_servers_and_end_with_the_provider(cluster, tmp_path):
    import ray

    from cmdare.errors import UserInputError

    with pytest.raises(UserInputError, match="ready_nodes"):
        LocalClusterProvider(cluster, ready_nodes=-1)
    provider = LocalClusterProvider(cluster, scratch_root=tmp_path / "nodes", ready_nodes=1)
    spec = ServerSpec("K80", "gcp", "us-east1", True, 0.1)
    first = provider.request(spec)
    provider.prepare(first)  # its own node, and one more started for the next server
    idle = provider._idle[0].future.result(timeout=120)
    assert len(cluster.worker_nodes) == 2 and idle is not first.node
    second = provider.request(spec)
    provider.prepare(second, background=True)  # takes the node that was ready; another starts in its place
    assert provider._node(second) is idle and second.scratch_dir.is_dir() and second.scratch_dir != first.scratch_dir

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    assert ray.get(where.options(**provider.actor_options(second)).remote(), timeout=60) == idle.node_id
    provider.release(first)
    provider.release(second)
    assert not second.scratch_dir.exists()
    provider.close()  # the idle node goes with the provider
    assert not cluster.worker_nodes
