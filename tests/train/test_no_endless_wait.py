"""No wait without an end, on real Ray: a run either recovers or ends with one line saying what failed.

(a) both synchronous workers revoked at one step: the round shrinks, the replacements join, the run finishes;
(c) a worker whose constructor fails in its own process (a dataset registered only on the driver): the run ends
    with the worker's own message instead of replacing it again and again.
The silent-cluster case (b) is in ``test_dead_node.py``.
"""

from __future__ import annotations

import pytest

from cmdare.errors import TransientError
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _Events(TrainCallback):
    def __init__(self):
        self.events = []

    def on_event(self, r):
        self.events.append(r)


@pytest.mark.parametrize("seed", [0, 1])
def test_both_synchronous_workers_revoked_at_one_step_recover(local_ray, tmp_path, seed):
    # 1 emulated second a step: both slots revoked at 10 s, round 10 (a synchronous round takes its slowest
    # worker's step); replacements ready at once, so each trains once its process is up
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=60, batch_size=16, sync=True,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, seed=seed, transient=True,
                     revocations="trace=10@0+10@1,step=1", replace="same", startup="0", chunk_steps=5)
    log = _Events()
    trainer = Trainer(spec, [log], checkpoint_dir=tmp_path)
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 60
    assert summary.revocations == 2 and summary.replacements == 2
    revoked = [step for _t, step, c in trainer.controller.history if type(c).__name__ == "Revoke"]
    assert revoked == [10, 10]


def test_a_worker_that_cannot_start_ends_the_run_with_its_own_message(local_ray, tmp_path, monkeypatch):
    from cmdare.datasets import base

    # registered in this process only: every worker process looks the name up and fails in its constructor
    digits = base._REGISTRY["digits"]
    monkeypatch.setitem(base._REGISTRY, "driver-only-digits", base.DatasetSpec("driver-only-digits", digits.loader))
    spec = TrainSpec(model="resnet8", dataset="driver-only-digits", workers=2, ps=1, steps=40, batch_size=16,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, transient=True,
                     revocations="none", replace="same", startup="0")
    log = _Events()
    with pytest.raises(TransientError) as err:
        Trainer(spec, [log], checkpoint_dir=tmp_path).run()
    message = str(err.value)
    assert "could not start" in message and "driver-only-digits" in message and "\n" not in message
    # no replacement was started for a failure every replacement would repeat
    assert not [e for e in log.events if e.kind == "replacement_requested"]
