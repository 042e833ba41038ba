"""A replacement keeps off the node the run has just lost a worker on (issue 42 item 9).

The GCS lists a dead node as alive until its health checks have failed long enough, and would place the
replacement there. The provider of a real cluster puts Ray's label selector on the node id label into the
replacement's options; the avoided node is forgotten once the GCS marks it dead, or once it outlived the loss
(its worker failed, not the node). A start that failed because its node went is told apart, in words, from a
failure of the worker's own code.
"""

from __future__ import annotations

import pytest

from cmdare.cloud.ray_cluster import NODE_ID_LABEL, RayClusterProvider, label_selectors
from cmdare.cloud.servers import ServerSpec
from cmdare.train.workers.lost_nodes import LostNodes
from cmdare.train.workers.worker_handle import start_error

K80 = ServerSpec("k80", "gcp", "us-east1", True, 0.14)
A, B = "a1" * 28, "b2" * 28  # node ids: 56 hex digits


def _provider() -> RayClusterProvider:
    provider = RayClusterProvider()
    provider._worker_keys = (True, False)  # the cluster's nodes offer cmdare_worker (no Ray asked)
    return provider


def test_a_worker_asks_for_no_avoided_node_and_ray_accepts_the_selector():
    from ray._private.label_utils import validate_label_selector

    assert label_selectors()  # Ray 2.60 places actors by label selectors
    provider = _provider()
    server = provider.request(K80)
    assert provider.actor_options(server) == {"resources": {"cmdare_worker": 1}}
    provider.avoid(A, 10.0)
    one = provider.actor_options(server)
    assert one["label_selector"] == {NODE_ID_LABEL: f"!{A}"} and one["resources"] == {"cmdare_worker": 1}
    provider.avoid(B, 11.0)
    both = provider.actor_options(server)["label_selector"]
    assert both == {NODE_ID_LABEL: f"!in({A},{B})"}
    assert validate_label_selector(one["label_selector"]) is None and validate_label_selector(both) is None
    provider.forget(A)
    provider.forget(B)
    assert "label_selector" not in provider.actor_options(server)


def test_an_avoided_node_is_forgotten_when_dead_or_when_it_outlived_the_loss():
    states = {A: True, B: True}
    nodes = LostNodes(_provider(), state=states.get, avoid_s=60.0)
    nodes.lost(A, 100.0)
    nodes.lost(B, 100.0)
    nodes.lost(None, 100.0)  # a worker that never came up: no node known
    assert nodes.avoided() == (A, B)
    assert nodes.settle(110.0) == [] and nodes.avoided() == (A, B)  # both alive to the GCS, not for long yet
    states[A] = False  # the GCS marked A dead: nothing is placed there any more
    assert nodes.settle(111.0) == []  # asked again only after CHECK_EVERY_S
    assert nodes.settle(112.0) == [] and nodes.avoided() == (B,)
    states[B] = None  # the GCS did not answer: kept
    assert nodes.settle(170.0) == [] and nodes.avoided() == (B,)
    states[B] = True  # alive a minute after the loss: its worker failed, not the node
    assert nodes.settle(172.0) == [B] and nodes.avoided() == ()


def test_a_node_the_gcs_marked_dead_already_is_not_avoided():
    """The lost worker's node was marked dead before the loss was handled: a selector against it keeps nothing
    off it; the replacement asks for nothing but its resources (an autoscaler then launches a node for it)."""
    nodes = LostNodes(_provider(), state={A: False, B: None}.get)
    nodes.lost(A, 100.0)
    nodes.lost(B, 100.0)  # the GCS did not answer: kept off, to be safe
    assert nodes.avoided() == (B,)


def test_lost_nodes_are_nothing_to_an_emulated_provider():
    from cmdare.cloud.local import LocalProcessProvider

    nodes = LostNodes(LocalProcessProvider(), state=lambda _n: pytest.fail("no GCS asked"))
    nodes.lost(A, 1.0)
    assert nodes.avoided() == () and nodes.settle(1e9) == []


def test_a_start_that_failed_with_its_node_is_named_so_and_not_deterministic():
    from ray.exceptions import RayActorError

    cancelled = RayActorError(error_msg="The actor died unexpectedly before finishing this task.\n\tclass_name: "
                                        "Worker\nThe actor never ran - it was cancelled before it started running.")
    assert start_error(cancelled) == ("its creation was cancelled before it ran (its node died or was drained)", False)
    died = RayActorError(error_msg="The actor is dead because its node has died. Node Id: " + A)
    assert start_error(died) == ("its node died while it started", False)
    own = RayActorError(error_msg="The actor died because of an error raised in its creation task, ray::Worker."
                                  "__init__()\nValueError: bad layer", actor_init_failed=True)
    assert start_error(own) == ("bad layer", True)


def test_on_a_real_cluster_a_worker_lands_on_no_avoided_node(cluster):
    """Ray itself: the options the provider gives keep the actor off the avoided node; with every worker node
    avoided it waits, and it is placed once a node it may use joins."""
    import ray

    @ray.remote
    class Where:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    nodes = [cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"cmdare_worker": 1})
             for _ in range(2)]
    try:
        cluster.wait_for_nodes()
        provider = RayClusterProvider()
        server = provider.request(K80)
        first, second = (n.node_id for n in nodes)
        provider.avoid(first, 0.0)
        actor = Where.options(num_cpus=1, **provider.actor_options(server)).remote()
        assert ray.get(actor.node.remote(), timeout=60) == second
        ray.kill(actor)
        provider.avoid(second, 0.0)
        waiting = Where.options(num_cpus=1, **provider.actor_options(server)).remote()
        ready, _ = ray.wait([waiting.node.remote()], timeout=3)
        assert not ready  # every worker node avoided: it waits for another
        nodes.append(cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"cmdare_worker": 1}))
        assert ray.get(waiting.node.remote(), timeout=60) == nodes[-1].node_id
        ray.kill(waiting)
    finally:
        for n in nodes:
            cluster.remove_node(n)
