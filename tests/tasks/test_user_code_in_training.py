"""A mistake in user code that only shows on a worker, after the driver's one-batch check, ends the run with the
one line the worker's task raised, naming the part and the step (issue 42): deterministic, so no worker is
revoked or replaced for it, on real Ray workers (the worker's loop calls ``Task.step_loss`` and ``Task.backward``;
the driver ends the run on the ``CodeFailed`` its ``UserInputError`` becomes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cmdare.errors import CmdareError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback

PROJECT = Path(__file__).parents[1] / "workloads" / "user_project"


@pytest.fixture(scope="module", autouse=True)
def _user_project_on_workers():
    """The user's package on the path of this process and of the Ray workers (set before Ray starts)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(PROJECT))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])))
        yield


class _Events(TrainCallback):
    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.status = ""

    def on_event(self, report) -> None:
        self.kinds.append(report.kind)

    def on_run_end(self, summary) -> None:
        self.status = summary.status


def test_a_workers_mistake_ends_the_run_in_one_line_and_revokes_nothing(local_ray, tmp_path):
    """Items go wrong after the first 200 a process fetches: the driver's check passes, each worker meets it."""
    events = _Events()
    spec = TrainSpec(model="mypkg.tasks:build_regressor", dataset="mypkg.faults:late_raising_set",
                     loss="mypkg.tasks:mse", workers=2, ps=1, steps=200, revocations="none", checkpoint_every=0,
                     eval_every=0)
    with pytest.raises(CmdareError) as err:
        Trainer(spec, [events], checkpoint_dir=tmp_path).run()
    text = str(err.value)
    assert text.startswith("--dataset mypkg.faults:late_raising_set at step ") and "\n" not in text, text
    assert events.status == "failed"
    assert not {"revocation", "worker_lost", "replacement_requested"} & set(events.kinds), events.kinds
