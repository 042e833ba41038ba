"""`cmdare train` on bad input: one line, non-zero exit, nothing saved is damaged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cmdare.train.checkpoint import Checkpoint, latest_checkpoint, save_checkpoint

CMDARE = [str(Path(sys.executable).parent / "cmdare")]


def _run(args, home):
    env = dict(os.environ, CMDARE_HOME=str(home))
    return subprocess.run(CMDARE + ["train", "--no-record", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("args", [
    ["--model", "no-such-model"],
    ["--dataset", "no-such-data"],
    ["--workers", "0"],
    ["--ps", "0"],
    ["--dataset", "cifar10", "--data-dir", "/no/such/dir"],
    ["--address", "127.0.0.1:1"],
    ["--placement", "no-such-placement"],
    ["--gpu", "no-such-gpu"],
    ["--region", "nowhere-1"],
    ["--revocations", "lifetime=/no/such/lifetimes.json"],
    ["--revocations", "every=-2"],
    ["--replace", "sometimes"],
    ["--lr-policy", "wild"],
    ["--straggler", "9:3"],
    ["--ps-bandwidth", "fast"],
    ["--ps-bandwidth", "0MB/s"],
    ["--elastic-ps"],
])
def test_bad_input_is_one_line(tmp_path, args):
    res = _run([*args, "--steps", "5"], tmp_path)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr + res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr


def test_corrupt_checkpoint_is_refused_and_kept(tmp_path):
    run_dir = tmp_path / "checkpoints" / "run-x"
    path, _ = save_checkpoint(run_dir, Checkpoint(10, np.zeros(5, np.float32), np.zeros(5, np.float32)))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    res = _run(["--resume", "run-x", "--model", "resnet8", "--steps", "20"], tmp_path)
    assert res.returncode != 0 and "checksum mismatch" in res.stderr and "Traceback" not in res.stderr
    assert latest_checkpoint(run_dir) == path and path.read_bytes() == bytes(data)  # left as it was


def test_ps_commands_refuse_finished_runs_and_the_last_shard(tmp_path):
    from cmdare.train.balancing import write_status

    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    run_dir = tmp_path / "checkpoints" / "run-p"

    def ps(*args):
        return subprocess.run(CMDARE + ["ps", *args], capture_output=True, text=True, env=env, timeout=60)

    res = ps("add", "run-none")
    assert res.returncode == 1 and "no running training run" in res.stderr
    write_status(run_dir, "running", 1, 10)
    res = ps("remove", "run-p")
    assert res.returncode == 1 and "last shard" in res.stderr and "Traceback" not in res.stderr
    assert ps("add", "run-p").returncode == 0 and len(list((run_dir / "control").glob("*.json"))) == 1
    write_status(run_dir, "finished", 2, 100)
    res = ps("add", "run-p")
    assert res.returncode == 1 and "finished" in res.stderr
