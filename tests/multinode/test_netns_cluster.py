"""A real multi-node Ray cluster (``ray start``) in a loopback-only network namespace (see netns_cluster.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from netns_cluster import CMDARE, FAST_NODE_DEATH, NetnsCluster

pytestmark = pytest.mark.cluster  # make test-cluster: a multi-node `ray start` cluster


def _alive(pid: int) -> bool:
    """Whether host process ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_namespace_holds_only_loopback(netns: NetnsCluster) -> None:
    links = [line for line in netns.run(["ip", "-o", "link"], check=True).stdout.splitlines() if line.strip()]
    assert len(links) == 1, links
    match = re.match(r"\d+:\s*(\S+):\s*<([^>]*)>", links[0])
    assert match and match.group(1) == "lo", links
    assert "UP" in match.group(2).split(","), links
    # Its PID namespace is its own: the holder is PID 1 there, and the host's processes are not to be seen.
    pids = netns.run(["sh", "-c", "ls /proc | grep -E '^[0-9]+$'"], check=True).stdout.split()
    assert "1" in pids and len(pids) < 10, pids


@pytest.mark.timeout(420)
def test_joined_run_with_default_options_injects_no_revocation(
        netns_cluster: Callable[..., NetnsCluster]) -> None:
    cluster = netns_cluster(workers=2, head_cpus=3)
    proc = cluster.run(
        [CMDARE, "train", "--address", cluster.address, "--model", "resnet8", "--steps", "40", "--workers", "2",
         "--checkpoint-every", "20", "--eval-every", "0", "--no-record", "--tensorboard", "none"],
        env={"CMDARE_HOME": str(cluster.tmp / "driver"), "COLUMNS": "200"}, timeout=360)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:] + "\n" + cluster.logs_tail()
    assert re.search(r"\bfinished: step 40\b", proc.stdout), out[-4000:]
    assert "servers: 0 revoked, 0 replaced" in proc.stdout, out[-4000:]
    assert (f"joined the Ray cluster at {cluster.address}: 3 nodes (1 parameter server, 2 workers), 5 CPUs, 0 GPUs"
            in proc.stderr), out[-4000:]
    assert "warning: checkpoints live on the head node only" in proc.stderr, out[-4000:]  # no --storage given
    # The workers really ran on the worker nodes, one each, and the parameter shard on the head.
    actors = cluster.actor_nodes()
    assert sorted(node for cls, _, node in actors if cls == "Worker") == ["node-0", "node-1"], actors
    assert {node for cls, _, node in actors if cls != "Worker"} == {"head"}, actors


@pytest.mark.timeout(420)
def test_your_own_code_by_import_path_trains_on_the_worker_nodes(netns_cluster: Callable[..., NetnsCluster]) -> None:
    """Issue 33: a model, data, loss and metric given only as import paths; each node's worker processes import
    the package themselves (it is on every node's path, as an installed package would be); nothing is
    registered anywhere."""
    waves = str(Path(__file__).resolve().parents[2] / "examples" / "waves")
    cluster = netns_cluster(workers=2, head_cpus=3, env={"PYTHONPATH": waves})
    proc = cluster.run(
        [CMDARE, "train", "--address", cluster.address, "--model", "waves.model:build_net", "--dataset",
         "waves.data:make_sets", "--loss", "waves.losses:mse", "--metric", "waves.losses:mae", "--lr", "0.005",
         "--weight-decay", "0", "--steps", "60", "--workers", "2", "--checkpoint-every", "30", "--eval-every", "30",
         "--no-record", "--tensorboard", "none"],
        env={"CMDARE_HOME": str(cluster.tmp / "driver"), "PYTHONPATH": waves, "COLUMNS": "200"}, timeout=360)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:] + "\n" + cluster.logs_tail()
    assert re.search(r"\bfinished: step 60 in [\d.]+ s, test loss [\d.]+, mae [\d.]+", proc.stdout), out[-4000:]
    actors = cluster.actor_nodes()
    assert sorted(node for cls, _, node in actors if cls == "Worker") == ["node-0", "node-1"], actors


@pytest.mark.timeout(180)
def test_address_auto_refuses_a_ray_cluster_cmdare_did_not_start(netns: NetnsCluster) -> None:
    """Before: it joined whatever Ray ran on the machine and died with an ActorDiedError traceback."""
    netns.start_plain_head(cpus=2)
    args = [CMDARE, "train", "--address", "auto", "--model", "resnet8", "--steps", "10", "--no-record",
            "--tensorboard", "none"]
    env = {"CMDARE_HOME": str(netns.tmp / "driver"), "RAY_ADDRESS": netns.address, "COLUMNS": "200"}
    proc = netns.run(args, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # Ray's core logs that it cannot reach 8.8.8.8 to learn this machine's address (this namespace has no
    # route out) before any logging can be configured; every other line is cmdare's.
    lines = [line for line in proc.stderr.strip().splitlines() if "network_util.cc" not in line]
    assert lines == [
        f"error: the Ray cluster at {netns.address}: 1 node, 2 CPUs, 0 GPUs was not started by cmdare (no node "
        "offers cmdare_worker, cmdare_ps or cmdare_head): start one from 'cmdare cluster-config' "
        "(docs/cluster.md), or pass --any-cluster to train on it anyway"], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.timeout(300)
def test_kill_worker_node_removes_the_node_and_its_disk(netns_cluster: Callable[..., NetnsCluster]) -> None:
    cluster = netns_cluster(workers=2, head_cpus=1, env=FAST_NODE_DEATH)
    (cluster.node_homes[0] / "data.txt").write_text("on node 0's disk")
    survivors = cluster.node_pids(1)
    assert survivors and not set(survivors) & set(cluster.node_pids(0))

    killed = cluster.kill_worker_node(0, wait=True)  # waits until the cluster shows 1 worker node
    assert killed and cluster.node_pids(0) == []
    assert not [pid for pid in killed if _alive(pid)], killed
    assert not cluster.node_homes[0].exists() and cluster.node_homes[1].exists()
    assert all(_alive(pid) for pid in survivors), survivors
    assert cluster.wait_for_workers(1, timeout=5)["cmdare_worker"] == 1
