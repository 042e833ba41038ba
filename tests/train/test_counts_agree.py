"""One definition of each count and rate: what `cmdare train` prints at the end and what `cmdare report run`
shows of the same run (steps, time, speed, revocations and replacements of workers and parameter servers).

Before issue 30 the summary said ``1 replaced`` and the report ``replacements 0`` for a PS replacement, and the
summary's steps, speed and time did not divide out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # two CLI runs on Ray

CMDARE = str(Path(sys.executable).parent / "cmdare")


@pytest.mark.timeout(400)
def test_train_summary_and_report_run_agree_on_a_run_with_a_worker_and_a_ps_replaced(tmp_path):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), COLUMNS="200")
    # cloud time moves 0.02 s a worker step: slot 0 is revoked at step 100, the PS server at step 150
    train = subprocess.run([CMDARE, "train", "--model", "resnet8", "--workers", "2", "--ps", "1", "--transient",
                            "--ps-transient", "--revocations", "trace=1@0+1.5@ps,notice=0,step=0.02", "--steps", "240",
                            "--checkpoint-every", "60", "--eval-every", "0", "--startup", "0", "--tensorboard", "none"],
                           capture_output=True, text=True, env=env, timeout=360)
    out = train.stdout
    assert train.returncode == 0, train.stderr[-3000:]
    head = re.search(r"run (\S+) finished: step (\d+) in ([\d.]+) s", out)
    speed = re.search(r"training: (\d+) steps at ([\d.]+) steps/s = ([\d.]+) s; start-up, checkpoints and the end "
                      r"([\d.]+) s", out)
    servers = re.search(r"servers: (\d+) revoked, (\d+) replaced", out)
    assert head and speed and servers, out
    run_id, step, wall_s = head.group(1), int(head.group(2)), float(head.group(3))
    assert (int(servers.group(1)), int(servers.group(2))) == (2, 2), out  # a worker and the PS server, each replaced
    # the printed figures divide and add up (to their rounding)
    trained, rate, train_s, rest_s = int(speed.group(1)), float(speed.group(2)), float(speed.group(3)), float(
        speed.group(4))
    assert trained == step == 240
    assert train_s == pytest.approx(trained / rate, rel=0.05)
    assert train_s + rest_s == pytest.approx(wall_s, abs=0.15)

    report = subprocess.run([CMDARE, "report", "run", run_id, "--format", "json", "--table", "summary"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    rows = json.loads(report.stdout)["tables"]["summary"]
    summary = {r["field"]: r["value"] for r in rows}
    assert int(summary["global_step"]) == step
    assert int(summary["revocations"]) == 2 and int(summary["replacements"]) == 2
    assert float(summary["steps_per_s"]) == pytest.approx(rate, abs=0.05)
    assert float(summary["wall_s"]) == pytest.approx(wall_s, abs=0.15)
