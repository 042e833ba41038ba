"""No wait without an end (b): a run whose own Ray node is marked dead ends with one line, instead of waiting
in a Ray call forever.

A real run in a process of its own, on a local Ray instance with the fast health checks of a multi-node test
cluster; its raylet is stopped (SIGSTOP) long enough for Ray's GCS to mark the node dead, then resumed: the
raylet exits, and from then on every Ray call of the driver blocks. The driver's watchdog must end the run
within a bounded time, with ``error: ...`` naming what failed and where the checkpoint is, and exit status 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cmdare.train.runtime.cluster_health import LoopWatchdog

_RUN = """
import ray
from cmdare.cloud.detection import LOCAL_FAILURE_DETECTION, INLINE_OBJECTS
ray.init(address="local", num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
         logging_level="ERROR", _system_config={**LOCAL_FAILURE_DETECTION, **INLINE_OBJECTS})
from cmdare.errors import CmdareError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback

class Started(TrainCallback):
    def on_step(self, r):
        if r.global_step >= 40 and not hasattr(self, "said"):
            self.said = True
            print("TRAINING", flush=True)

spec = TrainSpec(model="resnet8", workers=2, steps=10**6, checkpoint_every=20, eval_every=0, transient=True,
                 revocations="none", startup="0")
try:
    Trainer(spec, [Started()], checkpoint_dir={ckpt!r}).run()
except CmdareError as err:  # what the command line does with it
    import sys
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
"""


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _raylet_of(pid: int) -> int:
    for child in _children(pid):
        with open(f"/proc/{child}/cmdline", "rb") as fh:
            if b"raylet" in fh.read().split(b"\\0")[0]:
                return child
    raise AssertionError("no raylet under the run's process")


@pytest.mark.cluster  # make test-cluster: a run on Ray until its node is marked dead
def test_a_run_whose_ray_node_is_marked_dead_ends_with_one_line(tmp_path):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    err_file = (tmp_path / "stderr.txt").open("w")  # Ray logs a lot when its raylet dies: no pipe to fill up
    proc = subprocess.Popen([sys.executable, "-c", _RUN.replace("{ckpt!r}", repr(str(tmp_path / "ckpt")))], env=env,
                            stdout=subprocess.PIPE, stderr=err_file, text=True)
    try:
        assert proc.stdout.readline().strip() == "TRAINING"  # training went on for a while
        raylet = _raylet_of(proc.pid)
        os.kill(raylet, signal.SIGSTOP)  # misses its health checks: marked dead after a second or so
        time.sleep(3)
        os.kill(raylet, signal.SIGCONT)  # ... learns it and exits; the driver's Ray calls block from then on
        t0 = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        err_file.close()
    err = (tmp_path / "stderr.txt").read_text()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1, err[-3000:]
    assert len(lines) == 1 and "this run's Ray node was marked dead" in lines[0], err[-3000:]
    assert "latest checkpoint is step" in lines[0] and str(tmp_path / "ckpt") in lines[0]
    assert took < 60, took  # the watchdog looked within seconds of the loop going silent
    status = (tmp_path / "ckpt" / "status.json").read_text()
    assert '"failed"' in status


@pytest.mark.parametrize("alive, expect", [(True, None), (False, "dead"), (None, "does not answer")])
def test_the_watchdog_acts_only_on_a_silent_loop_whose_node_is_gone(alive, expect):
    seen = []
    dog = LoopWatchdog("node", seen.append, silent_s=0.0, check=lambda _node: alive, check_every_s=0.01).start()
    time.sleep(0.3)
    dog.stop()
    if expect is None:
        assert seen == []
    else:
        assert len(seen) == 1 and expect in seen[0]
