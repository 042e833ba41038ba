"""TensorBoardCallback writes the scalars cmdare runs expose; the importer brings them back."""

from __future__ import annotations

import pickle

from cmdare.measure.importers.tensorboard_import import import_tensorboard
from cmdare.measure.store import open_store
from cmdare.measure.tensorboard import TensorBoardCallback
from cmdare.train.callbacks import CheckpointReport, EvalReport, RunSummary, StepReport, TrainCallback


def test_event_files_roundtrip_into_the_store(tmp_path):
    cb = pickle.loads(pickle.dumps(TensorBoardCallback(tmp_path / "tb")))
    assert isinstance(cb, TrainCallback)
    t0 = 1.7e9
    for i in range(1, 21):
        cb.on_step(StepReport("r", t0 + i, i * 10, 0, 10, 1.0, 2.0 / i, 10.0 + i))
    cb.on_eval(EvalReport("r", t0 + 21, 200, 0, 0.75, 0.4))
    cb.on_checkpoint(CheckpointReport("r", t0 + 22, 200, 0, "/c", 100, 0.3))
    cb.on_run_end(RunSummary("r", t0 + 23, "finished", 200, 23.0, 8.7, 0.75, 0.4))
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    res = import_tensorboard(store, tmp_path / "tb", "tb-run", workers=2, gpu_type="k80")
    assert res.read == 20 + 20 + 1 + 1
    assert res.reasons() == {"unmapped tag checkpoint_s": 1}
    steps = store.frame("step_metrics")
    speed = steps[steps.cluster_steps_per_s.notna()].sort_values("global_step")
    assert list(speed.global_step) == [i * 10 for i in range(1, 21)]
    assert speed.cluster_steps_per_s.iloc[-1] == 30.0
    assert steps.loss.notna().sum() == 20
    assert store.frame("eval_metrics").accuracy.tolist() == [0.75]
    assert store.count("cluster_speed_samples") == 20
    assert import_tensorboard(store, tmp_path / "tb", "tb-run").imported == 0  # idempotent
