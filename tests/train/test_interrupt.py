"""Ctrl-C and SIGTERM are a notice (issue 42): SIGINT mid-run exited 130 with no word and lost every step since the
last checkpoint (131 steps: the last checkpoint 200, interrupted at 331). Now the first stores the step the run
stops at and says the run's id, that step and the resume command; a second ends the run at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CMDARE = str(Path(sys.executable).parent / "cmdare")
ARGS = ["train", "--model", "resnet8", "--steps", "100000", "--checkpoint-every", "100", "--eval-every", "0",
        "--workers", "2", "--no-record", "--tensorboard", "none"]


def _start(tmp_path: Path, *extra: str, group: bool = False) -> subprocess.Popen:
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), COLUMNS="200")
    return subprocess.Popen([CMDARE, *ARGS, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=group)


def _wait_for_checkpoint(tmp_path: Path, proc: subprocess.Popen, step: int = 100) -> Path:
    """The run's directory once the checkpoint of ``step`` is stored (an event, not a wall time)."""
    while proc.poll() is None:
        found = list((tmp_path / "checkpoints").glob(f"*/ckpt-{step:09d}.json"))
        if found:
            return found[0].parent
        time.sleep(0.2)
    raise AssertionError(f"the run ended before step {step}: {proc.communicate()}")


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.cluster)],
                         ids=["SIGINT", "SIGTERM"])  # the second: the long tier (the same path, another signal)
def test_a_signal_stores_the_step_the_run_stops_at_and_says_how_to_resume(tmp_path, sig):
    proc = _start(tmp_path, "--revocations", "none")
    run_dir = _wait_for_checkpoint(tmp_path, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in out + err
    run_id = run_dir.name
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(rf"error: run {run_id} interrupted \({sig.name}\) at step (\d+); the latest checkpoint is "
                         rf"step (\d+) in {re.escape(str(run_dir))}; resume with --resume {run_id}", last)
    assert match and match.group(1) == match.group(2), last
    stopped = int(match.group(1))
    assert stopped > 100 and (run_dir / f"ckpt-{stopped:09d}.json").exists()  # nothing trained is lost
    assert f"{sig.name}: run {run_id} stops at the next step and stores it" in err


@pytest.mark.cluster  # a terminal's Ctrl-C reaches the whole process group, Ray's processes too; then twice
def test_ctrl_c_of_the_process_group_stores_the_step_and_a_second_stops_at_once(tmp_path):
    proc = _start(tmp_path, "--revocations", "none", group=True)
    run_dir = _wait_for_checkpoint(tmp_path, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130 and "Traceback" not in out + err, err[-2000:]
    stopped = int(re.search(r"interrupted \(SIGINT\) at step (\d+); the latest checkpoint is step \1 ", err).group(1))
    assert (run_dir / f"ckpt-{stopped:09d}.json").exists()
    # a second Ctrl-C: at once, without the checkpoint of the step it stopped at
    proc = _start(tmp_path / "twice", "--revocations", "none", group=True)
    run_dir = _wait_for_checkpoint(tmp_path / "twice", proc)
    os.killpg(proc.pid, signal.SIGINT)
    said = ""
    while "stops at the next step" not in said:  # the first is handled (two at once are one signal)
        said = proc.stderr.readline()
        assert said, "the run ended before it said it was stopping"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in out + err, err[-2000:]
    assert re.search(rf"error: run {run_dir.name} stopped at once at step \d+; the latest checkpoint is step \d+ ",
                     err), err[-2000:]
