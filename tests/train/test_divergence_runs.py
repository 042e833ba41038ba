"""Divergence on real Ray workers (issue 42): at lr 5 the zoo's loss grew to 2.9e14 while staying finite, no
rollback happened and the run ended on '3 checkpoint uploads in a row failed'. Now a loss that explodes (or
non-finite parameters) is divergence: the shards roll back, and nothing broken reaches storage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cmdare.errors import TransientError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback

PROJECT = Path(__file__).parent / "user_regression"


class _Events(TrainCallback):
    def __init__(self):
        self.events = []

    def on_event(self, r):
        self.events.append(r)

    def kinds(self, kind):
        return [e for e in self.events if e.kind == kind]


@pytest.fixture(scope="module", autouse=True)
def _user_regression_on_workers():
    """The test's regression package on the path of this process and of the Ray workers (set before Ray starts)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(PROJECT))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])))
        yield


def test_an_exploding_finite_loss_rolls_back_and_stores_nothing_broken(local_ray, tmp_path):
    """The loss's value grows a million-fold after 60 steps of each worker while the parameters stay finite: a
    rollback, then (the loss explodes again) the run ends on the second divergence in one line."""
    spec = TrainSpec(model="userreg:build", dataset="userreg:data", loss="userreg:exploding_loss", workers=2, ps=1,
                     steps=400, batch_size=32, seed=1, checkpoint_every=40, eval_every=0, on_diverge="rollback:1",
                     chunk_steps=5)
    log = _Events()
    with pytest.raises(TransientError) as err:
        Trainer(spec, [log], checkpoint_dir=tmp_path).run()
    assert str(err.value).startswith("training diverged again after 1 rollback(s): worker "), err.value
    assert "over 100x its level of" in str(err.value) and "\n" not in str(err.value)
    restored = [e for e in log.kinds("shard_restored") if e.details.get("reason") == "diverged"]
    assert len(restored) == 1 and "over 100x its level" in restored[0].details["why"]
    assert not log.kinds("checkpoint_failed"), [e.details for e in log.kinds("checkpoint_failed")]
    # the controller's state goes with each checkpoint (here both were stored before the rollback, which the second
    # divergence followed within 40 steps); a resume restores it: tests/control/test_divergence.py
    from cmdare.storage import as_storage
    from cmdare.train.duties.checkpoint import CheckpointStore

    store = CheckpointStore(as_storage(tmp_path))
    saved = [store.load(n).meta.get("controller") for n in store.manifests()]
    assert [(s["rollbacks"], s["lr_damping"]) for s in saved] == [(0, 1.0)] * len(saved) != []
