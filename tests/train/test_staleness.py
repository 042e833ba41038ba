"""Push staleness grows with asynchronous workers (the ordering, not a fixed accuracy)."""

from __future__ import annotations

import pytest

from cmdare.measure.recorder import StoreRecorder
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _Staleness(TrainCallback):
    def __init__(self):
        self.values: list[int] = []
        self.workers: set[int] = set()

    def on_step(self, report):
        self.values.extend(report.staleness)
        if report.staleness:
            self.workers.add(report.worker_id)


def _run(workers: int, tmp_path, recorder=None, steps: int = 60) -> tuple[_Staleness, object]:
    spec = TrainSpec(model="resnet8", dataset="digits", workers=workers, ps=1, steps=steps, batch_size=16,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, seed=0, chunk_steps=3)
    log = _Staleness()
    summary = Trainer(spec, [log] + ([recorder] if recorder else []), checkpoint_dir=tmp_path / str(workers)).run()
    return log, summary


@pytest.mark.cluster  # make test-cluster: runs with 1 to 4 async workers
def test_staleness_grows_with_async_workers(local_ray, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    one, s1 = _run(1, tmp_path)
    recorder = StoreRecorder(url)
    # Workers join as their actors come up; at ~150 steps/s the first one alone finished 60 steps
    # before any other joined, so the four-worker run is long enough for the others to arrive.
    four, s4 = _run(4, tmp_path, recorder, steps=600)
    recorder.close()
    assert s1.status == s4.status == "finished"
    assert one.values and set(one.values) == {0}  # a lone worker is never stale
    assert len(four.values) >= 600 and len(four.workers) >= 2
    mean4 = sum(four.values) / len(four.values)
    assert mean4 > 0 and max(four.values) >= 1  # others push between a worker's pull and its push
    # The per-worker histogram reaches the store and agrees with the pushes seen by the callbacks.
    from cmdare.measure.reports import build_report
    from cmdare.measure.store.repository import open_store

    store = open_store(url)
    hist = store.frame("staleness")
    report = build_report("run", store, run_id=s4.run_id)
    store.close()
    hist = hist[hist["run_id"] == s4.run_id]
    assert hist["count"].sum() == len(four.values)
    assert (hist["staleness"] * hist["count"]).sum() / hist["count"].sum() == mean4
    table = report.tables["staleness"]  # the staleness view of `cmdare report run`
    assert table["worker_id"].iloc[-1] == "all" and table["pushes"].iloc[-1] == len(four.values)
    assert table["mean"].iloc[-1] == round(mean4, 3)


def test_staleness_table_quantiles():
    import pandas as pd

    from cmdare.measure.reports.run import staleness_table

    hist = pd.DataFrame({"worker_id": [0, 0, 0, 1], "staleness": [0, 1, 5, 2], "count": [50, 40, 10, 100]})
    t = staleness_table(hist).set_index("worker_id")
    assert t.loc["0", "pushes"] == 100 and t.loc["0", "mean"] == 0.9
    assert t.loc["0", "p50"] == 0 and t.loc["0", "p95"] == 5 and t.loc["0", "max"] == 5
    assert t.loc["all", "pushes"] == 200 and t.loc["all", "mean"] == 1.45
    assert staleness_table(hist.iloc[:0]).empty
