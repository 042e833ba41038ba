"""Checkpoints of a run joined to a real ``ray start`` cluster, whose worker nodes each see a private data
directory (as VMs do), go to ``--storage``, and the run resumes from there on a fresh local Ray."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable

import pytest
from netns_cluster import CMDARE, NetnsCluster

from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import CheckpointStore

pytestmark = pytest.mark.cluster  # make test-cluster: a multi-node `ray start` cluster


@pytest.mark.timeout(600)
def test_joined_run_checkpoints_into_storage_and_resumes_on_a_fresh_local_ray(
        netns_cluster: Callable[..., NetnsCluster]) -> None:
    cluster = netns_cluster(workers=2, head_cpus=3)
    storage = cluster.tmp / "shared-storage"  # what every machine reaches (a shared mount, or a bucket)
    driver_home = cluster.tmp / "driver"
    proc = cluster.run(
        [CMDARE, "train", "--address", cluster.address, "--storage", str(storage), "--model", "resnet8",
         "--steps", "40", "--workers", "2", "--checkpoint-every", "20", "--eval-every", "0", "--no-record",
         "--tensorboard", "none"], env={"CMDARE_HOME": str(driver_home), "COLUMNS": "200"}, timeout=360)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:] + "\n" + cluster.logs_tail()
    assert "servers: 0 revoked, 0 replaced" in proc.stdout, out[-4000:]  # default options: no injection
    assert "checkpoints live on the head node only" not in out  # --storage given: no warning
    run_id = re.search(r"run (run-\S+) finished: step 40", proc.stdout).group(1)
    run = Storage(storage / run_id)
    assert CheckpointStore(run).load().step == 40
    assert f"checkpoints: {storage / run_id}" in proc.stdout
    for home in [*cluster.node_homes, driver_home]:  # nothing on any server's own disk
        assert not list(home.rglob("ckpt-*")), home

    # A fresh local Ray on another "machine" (outside the namespace, a new data directory): same storage.
    env = dict(os.environ, CMDARE_HOME=str(cluster.tmp / "elsewhere"))
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run([CMDARE, "train", "--resume", run_id, "--storage", str(storage), "--steps", "60",
                          "--no-record", "--tensorboard", "none"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resumed {run_id} from step 40" in res.stdout and "finished: step 60" in res.stdout, res.stdout
    assert CheckpointStore(run).load().step == 60
