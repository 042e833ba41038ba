"""The local Ray instance ``cmdare train`` starts: its training processes run at the machine's normal priority."""

from __future__ import annotations

import os
import subprocess
import sys

_NICENESS = """
import os
from cmdare.train.run.ray_session import ensure_ray
import ray
assert ensure_ray(num_cpus=1)

@ray.remote(num_cpus=1)
class Trainer:
    def niceness(self):
        return os.nice(0)

print(ray.get(Trainer.remote().niceness.remote()))
ray.shutdown()
"""


def test_training_actors_of_the_local_instance_are_not_niced():
    # Ray starts worker processes 15 niceness steps below its own: on a core shared with any other work they
    # starved (670 ms of compute per step against 16 ms idle). The instance cmdare starts gives them the
    # priority of the process that started it.
    res = subprocess.run([sys.executable, "-c", _NICENESS], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.split()[-1]) == os.nice(0)
