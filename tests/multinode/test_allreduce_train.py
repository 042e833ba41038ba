"""``cmdare train --topology allreduce`` joined to a real ``ray start`` cluster in a loopback-only namespace: a
member's worker node is killed mid-run (every process of it, as a revocation without notice does); the survivor
re-forms the group on its own state (no checkpoint loaded), a replacement member starts on the spare worker node,
heals from the survivor, and the run finishes."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable

import pytest
from netns_cluster import CMDARE, FAST_NODE_DEATH, NetnsCluster
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_a_killed_member_node_costs_a_regroup_and_its_replacement_heals_from_the_survivor(
        netns_cluster: Callable[..., NetnsCluster]) -> None:
    cluster = netns_cluster(workers=3, head_cpus=2, env=FAST_NODE_DEATH)
    storage, home = cluster.tmp / "storage", cluster.tmp / "driver"
    home.mkdir()
    proc = cluster.popen([CMDARE, "train", "--address", cluster.address, "--topology", "allreduce", "--model",
                          "resnet8", "--workers", "2", "--steps", "3000", "--transient", "--replace", "same",
                          "--revocations", "none", "--checkpoint-every", "100", "--eval-every", "0",
                          "--tensorboard", "none"],
                         env={"CMDARE_HOME": str(home), "CMDARE_STORAGE": str(storage), "COLUMNS": "200"},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not list(storage.glob("*/ckpt-*.json")):  # training, a checkpoint stored: kill a member's node
            assert proc.poll() is None and time.time() < deadline, "the run ended or stalled before a checkpoint"
            time.sleep(0.3)
        members = sorted(node for cls, state, node in cluster.actor_nodes() if cls == "Replica" and state == "ALIVE")
        assert len(members) == 2 and all(n.startswith("node-") for n in members), members
        killed = members[0]
        cluster.kill_worker_node(int(killed.removeprefix("node-")))
        out, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:] + cluster.logs_tail()
    assert "finished: step 3000" in out, out[-3000:]
    assert re.search(r"servers: 1 revoked, 1 replaced", out), out[-3000:]
    engine = create_engine(f"sqlite:///{home / 'cmdare.db'}")
    with engine.connect() as c:
        regroups = [json.loads(r.details) if isinstance(r.details, str) else r.details
                    for r in c.execute(text("SELECT details FROM events WHERE kind = 'regroup' ORDER BY time"))]
    print("cmdare train --topology allreduce across nodes:", [(r["members"], r["root"], r["step"],
                                                                 round(r["duration_s"], 3)) for r in regroups])
    # the first group, the survivor alone (its own state), the survivor and the replacement (healed from it)
    assert [len(r["members"]) for r in regroups] == [2, 1, 2], regroups
    assert not any(r["from_checkpoint"] for r in regroups), regroups
    survivor = regroups[1]["members"][0]
    assert regroups[2]["root"] == survivor and regroups[2]["step"] >= regroups[1]["step"], regroups
    placed = [node for cls, _, node in cluster.actor_nodes() if cls == "Replica"]
    assert len(placed) == 3 and len(set(placed)) == 3 and killed in placed, placed  # the replacement on the spare
