"""Kill and resume on Ray: an emulated run resumed from a checkpoint revokes, replaces and checkpoints as the run
that never stopped (issue 43). The controller stores its state with each checkpoint; in emulation that is the whole
emulated fleet (cloud time, each worker's server, ready time and drawn lifetime, the revocation source's draws), so
the resumed run goes on with the same fleet. The fake-driver scenarios are in ``tests/control/test_resume_fleet.py``."""

from __future__ import annotations

import pytest

from cmdare.control import run_commands as C
from cmdare.train import Trainer, TrainSpec


def _after(controller, step: int) -> list[tuple]:
    """The fleet's decisions after ``step``: what, at which step, for which worker (not the duties' snapshots)."""
    return [(type(c).__name__, int(s), getattr(c, "worker_id", None), getattr(c, "replaces", None))
            for _t, s, c in controller.history
            if s > step and isinstance(c, C.Revoke | C.LoseWorker | C.StartWorker | C.Joined | C.SetChief)]


@pytest.mark.cluster  # make test-cluster: two emulated runs on a local Ray cluster
def test_an_emulated_run_resumed_from_a_checkpoint_decides_as_the_run_that_never_stopped(tmp_path):
    """The run trains 300 steps and stores checkpoints 100 and 200; resumed from 100 (a run killed after its
    checkpoint of step 100), it revokes and replaces the same workers at the same steps. Without the fleet in the
    saved state the resumed run drew lifetimes anew from the seed's start, with cloud time back at 0."""
    spec = TrainSpec(steps=300, seed=3, transient=True, revocations="lifetime=bathtub,speedup=30000",
                     checkpoint_every=100)
    whole = Trainer(spec, run_id="r", checkpoint_dir=tmp_path)
    summary = whole.run()
    assert summary.status == "finished"
    expected = _after(whole.controller, 100)
    assert any(kind == "Revoke" for kind, *_ in expected)  # the second half of the run is eventful
    resumed = Trainer(spec, run_id="r", checkpoint_dir=tmp_path, resume=True, resume_step=100)
    again = resumed.run()
    assert again.status == "finished" and again.global_step == 300
    assert _after(resumed.controller, 100) == expected
