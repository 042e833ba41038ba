"""The elastic all-reduce group across the nodes of a real ``ray start`` cluster in a loopback-only namespace:
a worker node is killed mid-training, the survivors re-form on their own state and train on, and a member started
on a node added afterwards heals from a peer (``allreduce_group_driver.py`` drives the group inside)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from netns_cluster import FAST_NODE_DEATH, PYTHON, NetnsCluster

pytestmark = pytest.mark.cluster

DRIVER = Path(__file__).with_name("allreduce_group_driver.py")


def _wait_for(path: Path, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the group's driver ended early (rc={proc.returncode})"
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.2)


@pytest.mark.timeout(480)
def test_a_killed_worker_node_costs_a_regroup_and_a_newcomer_on_a_new_node_heals(
        netns_cluster: Callable[..., NetnsCluster]) -> None:
    cluster = netns_cluster(workers=3, head_cpus=2, env=FAST_NODE_DEATH)
    control = cluster.tmp / "control"
    control.mkdir()
    proc = cluster.popen([PYTHON, str(DRIVER), cluster.address, str(control)],
                         env={"CMDARE_HOME": str(cluster.tmp / "driver")}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(control / "phase1", proc, 240)
        cluster.kill_worker_node(1)
        _wait_for(control / "phase2", proc, 120)
        cluster.add_worker_node()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out or "")[-3000:] + (err or "")[-5000:] + cluster.logs_tail()
    result = json.loads(out.strip().splitlines()[-1])
    print("allreduce group across nodes:", result)
    before = result["steps_before_loss"]
    # the survivors went on from their own state: at most the step in flight lost, then 3 more steps
    assert all(before + 3 <= s <= before + 2 + 3 for s in result["steps_after_regroup"]), result
    assert len(set(result["final_steps"])) == 1 and result["final_steps"][0] == result["steps_after_regroup"][0] + 3
    assert result["replicas_equal"] and result["newcomer_on_new_node"], result
    assert not any(result["lost"]), result
