"""The store: schema via Alembic, bad URLs, the recorder's hooks, and concurrent writers."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
from sqlalchemy import inspect

from cmdare.errors import StoreError
from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.store import open_store
from cmdare.measure.store.schema import Base, Run
from cmdare.train.callbacks import (
    CheckpointReport,
    EvalReport,
    EventReport,
    RunInfo,
    RunSummary,
    ShardReport,
    StepReport,
    TrainCallback,
)

REQUIRED_TABLES = {
    "runs",
    "run_parts",
    "servers",
    "events",
    "step_metrics",
    "shard_metrics",
    "eval_metrics",
    "staleness",
    "checkpoints",
    "speed_samples",
    "cluster_speed_samples",
    "lifetime_observations",
    "chief_rejoin_points",
    "imports",
    "alembic_version",
}


def test_open_store_creates_schema_through_alembic(db_url):
    store = open_store(db_url)
    tables = set(inspect(store.engine).get_table_names())
    assert tables >= REQUIRED_TABLES
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == "0004"
    assert all(n == 0 for n in store.counts().values())
    again = open_store(db_url)  # reopening is a no-op migration
    assert set(inspect(again.engine).get_table_names()) == tables
    store.close()
    again.close()


def test_migration_matches_declarative_schema(tmp_path):
    """The Alembic revision creates exactly the columns the ORM declares (no drift)."""
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    insp = inspect(store.engine)
    for name, table in Base.metadata.tables.items():
        cols = {c["name"] for c in insp.get_columns(name)}
        assert cols == {c.name for c in table.columns}, name


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg2://nobody@127.0.0.1:1/none",
        "not a url at all",
        "nosuchdialect://x/y",
    ],
)
def test_unusable_url_raises_one_line_store_error(url):
    with pytest.raises(StoreError) as err:
        open_store(url)
    assert "\n" not in str(err.value) and str(err.value)


def _run(recorder: StoreRecorder, run_id: str, steps: int, worker_id: int = 0, t0: float = 1.0e9) -> None:
    for i in range(steps):
        recorder.on_step(StepReport(run_id, t0 + i, i, worker_id, 1, 0.1, 1.0, 10.0, 0.07, 0.03, (0, 1)))


def test_recorder_hooks_write_every_table(db_url):
    store = open_store(db_url)
    rec = StoreRecorder(store, batch_size=7)
    assert isinstance(rec, TrainCallback)
    t0 = 1.7e9
    rec.on_run_start(RunInfo("run-a", {"model": "resnet15", "dataset": "digits", "workers": 2}, t0, "abc1", True))
    _run(rec, "run-a", 25, worker_id=1, t0=t0)
    rec.on_shard(ShardReport("run-a", t0 + 1, 10, 0, 10, 4000, 4000, 0.01, 100))
    rec.on_eval(EvalReport("run-a", t0 + 2, 20, 0, 0.8, 0.5))
    rec.on_checkpoint(CheckpointReport("run-a", t0 + 3, 20, 0, "/tmp/ck", 12345, 0.2, 10))
    rec.on_event(
        EventReport(
            "run-a",
            t0 + 4,
            "revocation",
            21,
            1,
            None,
            "srv-1",
            {"gpu_type": "k80", "price_per_hour_usd": 0.25, "transient": True},
        )
    )
    # Before the run ends, buffered rows below the batch size may still be in memory; run end flushes.
    rec.on_run_end(RunSummary("run-a", t0 + 30, "finished", 25, 30.0, 0.83, 0.8, 0.5, 1, 0, 0.01))
    counts = store.counts()
    assert counts["step_metrics"] == 25
    assert counts["shard_metrics"] == counts["eval_metrics"] == counts["checkpoints"] == counts["events"] == 1
    stale = store.frame("staleness").set_index("staleness")["count"].to_dict()
    assert stale == {0: 25, 1: 25}
    server = store.frame("servers").iloc[0]
    assert server.server_id == "srv-1" and server.gpu_type == "k80" and server.end_reason == "revocation"
    rec.on_event(
        EventReport(
            "run-a",
            t0 + 5,
            "server_requested",
            21,
            2,
            None,
            "srv-2",
            {"requested_at": t0 + 5, "provisioning_s": 2.0, "staging_s": 30.0, "booting_s": 40.0},
        )
    )
    rec.on_event(EventReport("run-a", t0 + 95, "server_joined", 30, 2, None, "srv-2", {"joined_at": t0 + 95}))
    rec.flush()
    joined = store.frame("servers").set_index("server_id").loc["srv-2"]
    assert joined.joining_s == pytest.approx(90 - 72)  # framework start after the VM booted
    with store.session() as s:
        run = s.get(Run, "run-a")
        assert (run.status, run.final_step, run.model, run.emulated, run.code_version) == (
            "finished",
            25,
            "resnet15",
            True,
            "abc1",
        )
        assert run.summary["revocations"] == 1
    # Resume: the run row is updated, not duplicated; staleness keeps accumulating.
    rec.on_run_start(RunInfo("run-a", {"model": "resnet15"}, t0 + 100, "abc2", False, resumed_from_step=25))
    _run(rec, "run-a", 3, worker_id=1, t0=t0 + 100)
    rec.close()
    assert store.count("runs") == 1
    assert store.frame("staleness").set_index("staleness")["count"].to_dict() == {0: 28, 1: 28}
    with store.session() as s:
        run = s.get(Run, "run-a")
        assert (run.status, run.resumed_from_step, run.started_at) == ("running", 25, t0)


def test_recorder_pickles_and_reopens_by_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    rec = pickle.loads(pickle.dumps(StoreRecorder(url, batch_size=5)))
    rec.on_run_start(RunInfo("run-p", {}, 1.0))
    _run(rec, "run-p", 12)
    rec.close()
    assert open_store(url).count("step_metrics") == 12


def _writer(url: str, worker_id: int, rows: int, go=None) -> None:
    rec = StoreRecorder(url, batch_size=50)
    rec.store.count("runs")  # connect first, then write together with the others
    if go is not None:
        go.wait(30)
    _run(rec, "run-c", rows, worker_id=worker_id)
    for i in range(rows // 10):
        rec.on_event(EventReport("run-c", 1.0e9 + i, "notice", i, worker_id))
    rec.close()


def test_concurrent_writers_lose_no_rows(db_url):
    store = open_store(db_url)  # create the schema once, before the writers start
    procs, rows = 4, 1500
    # fork: the children need no re-import (spawn would re-import torch through cmdare.train, ~3 s each)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    store.engine.dispose()  # no pooled connection may be shared with the children
    go = ctx.Event()
    workers = [ctx.Process(target=_writer, args=(db_url, w, rows, go)) for w in range(procs)]
    for p in workers:
        p.start()
    go.set()
    for p in workers:
        p.join(120)
        assert p.exitcode == 0
    assert store.count("step_metrics") == procs * rows
    assert store.count("events") == procs * rows // 10
    hist = store.frame("staleness")
    assert hist["count"].sum() == 2 * procs * rows  # two staleness values per step, none lost
    assert len(hist) == 2 * procs  # how long the writers take: bench/store_writers.py


def test_recorder_keeps_rows_while_the_store_fails(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    rec = StoreRecorder(store, batch_size=10)
    rec.on_run_start(RunInfo("run-f", {}, 1.0))
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE step_metrics RENAME TO step_metrics_away")
    _run(rec, "run-f", 25)  # two failed flushes: training goes on, rows stay buffered
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE step_metrics_away RENAME TO step_metrics")
    _run(rec, "run-f", 5, t0=2.0e9)
    rec.close()
    assert store.count("step_metrics") == 30
    assert store.frame("staleness")["count"].sum() == 60


def test_a_resume_that_fails_before_training_keeps_the_runs_recorded_result(tmp_path):
    """Issue 29: a resume that failed during set-up overwrote the run's row from finished|700|0.983 to failed|0|."""
    from cmdare.measure.store.schema import Event

    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    rec = StoreRecorder(store)
    rec.on_run_start(RunInfo("run-a", {"model": "resnet8", "steps": 700}, 1.0e9))
    rec.on_run_end(RunSummary("run-a", 1.0e9 + 60, "finished", 700, 60.0, 11.7, 0.983, 0.05))
    rec.on_run_start(RunInfo("run-a", {"model": "resnet8", "steps": 900}, 1.0e9 + 100, resumed_from_step=700))
    rec.on_run_end(RunSummary("run-a", 1.0e9 + 101, "failed", 700, 1.0, 0.0, None, None))
    with store.session() as s:
        run = s.get(Run, "run-a")
        assert (run.status, run.final_step, run.final_accuracy) == ("finished", 700, 0.983)
        assert run.config["steps"] == 700 and run.resumed_from_step == 0
        kinds = [e.kind for e in s.query(Event).filter_by(run_id="run-a")]
    assert kinds == ["resume_failed"]
    rec.on_run_start(RunInfo("run-a", {"model": "resnet8", "steps": 900}, 1.0e9 + 200, resumed_from_step=700))
    rec.on_run_end(RunSummary("run-a", 1.0e9 + 260, "finished", 900, 60.0, 3.3, 0.985, 0.04))  # one that trains
    with store.session() as s:
        run = s.get(Run, "run-a")
        assert (run.status, run.final_step, run.final_accuracy) == ("finished", 900, 0.985)
