"""What `cmdare train --address` learns of the cluster it joins: its nodes by cmdare role, and whether it is
cmdare's at all (a node offering ``cmdare_head``, ``cmdare_ps`` or ``cmdare_worker``)."""

from __future__ import annotations

from cmdare.cloud.catalog import load_catalog
from cmdare.cloud.launcher import cluster_config, local_start_command
from cmdare.train.run.ray_session import joined_cluster, node_role


def _node(alive: bool = True, **resources: float) -> dict:
    return {"Alive": alive, "Resources": resources}


def test_a_cmdare_cluster_is_described_by_role_and_dead_nodes_are_left_out():
    nodes = [_node(CPU=2, cmdare_head=1), _node(CPU=1, cmdare_ps=1),
             _node(CPU=1, GPU=1, cmdare_worker=1, cmdare_gpu_k80=1), _node(CPU=1, cmdare_worker=1, cmdare_gpu_k80=1),
             _node(CPU=1, GPU=1, cmdare_worker=1, cmdare_gpu_v100=1), _node(False, CPU=8, cmdare_worker=1)]
    info = joined_cluster(nodes, "127.0.0.1:6379")
    assert info.is_cmdare
    assert info.describe() == ("127.0.0.1:6379: 5 nodes (1 head, 1 parameter server, 2 k80 workers, 1 v100 worker), "
                               "6 CPUs, 2 GPUs")


def test_a_plain_ray_cluster_is_not_cmdare_s():
    info = joined_cluster([_node(CPU=4, GPU=1), _node(CPU=2, memory=1e9)], "10.0.0.1:6379")
    assert not info.is_cmdare
    assert info.describe() == "10.0.0.1:6379: 2 nodes, 6 CPUs, 1 GPU"
    assert node_role({"CPU": 1, "custom": 1}) is None


def test_every_cluster_config_head_carries_the_cmdare_marker():
    """The head is up before any other node: it alone must tell `--address auto` that the cluster is cmdare's."""
    catalog = load_catalog()
    for cloud, workers in (("gcp", "k80:2,v100:1"), ("aws", "v100:2"), ("local", "k80:2,v100:1")):
        config = cluster_config(catalog, cloud, workers=workers, ps=1, warn=[].append)
        head = config["available_node_types"][config["head_node_type"]]
        assert node_role(head["resources"]) == "head", (cloud, head)
    local = cluster_config(catalog, "local", workers="k80:2", ps=1, warn=[].append)
    assert "--resources='{\"cmdare_head\": 1}'" in local_start_command(local)
