"""``cmdare runs`` and ``cmdare runs show`` on a real SQLite store and real run storage; ``--resume`` and
``cmdare ps`` find a run's storage from the store (issue 30: there was no way to list runs or see a running
run's status, and ``--resume`` without ``--storage`` ignored the storage the run was recorded with)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cmdare.measure.reports.run import STALE_AFTER_S as SILENT_AFTER_S
from cmdare.measure.store import open_store
from cmdare.storage import run_storage
from cmdare.train.cli.runs_cmd import list_runs, recorded_storage, run_status
from cmdare.train.runtime.run_files import STALE_AFTER_S, write_status

CMDARE = str(Path(sys.executable).parent / "cmdare")


@pytest.fixture
def recorded(tmp_path):
    """A store with three runs: finished (its storage elsewhere), running (news now), killed (silent)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    now = time.time()
    elsewhere = tmp_path / "elsewhere"
    keys = ("dataset", "ended_at", "final_step", "final_accuracy", "cost_usd")
    store.insert_rows("runs", [{**dict.fromkeys(keys), **row} for row in [
        {"run_id": "run-a", "config": {"steps": 300, "storage": str(elsewhere)}, "model": "resnet15",
         "dataset": "digits", "status": "finished", "started_at": now - 900, "ended_at": now - 800,
         "final_step": 300, "final_accuracy": 0.97, "cost_usd": 0.01, "emulated": True},
        {"run_id": "run-b", "config": {"steps": 500}, "model": "resnet8", "status": "running",
         "started_at": now - 60, "emulated": True},
        {"run_id": "run-c", "config": {"steps": 500, "storage": "sftp://alice:***@host/ckpt"}, "model": "resnet8",
         "status": "running", "started_at": now - 3 * SILENT_AFTER_S, "emulated": False},
    ]])
    store.insert_rows("step_metrics", [
        {"run_id": "run-b", "time": now - 1, "global_step": 120, "worker_id": 0, "steps": 5, "duration_s": 0.1},
        {"run_id": "run-c", "time": now - 2 * SILENT_AFTER_S, "global_step": 40, "worker_id": 0, "steps": 5,
         "duration_s": 0.1},
    ])
    store.close()
    return url, elsewhere


def test_runs_lists_status_steps_cost_and_storage_newest_first(recorded):
    url, elsewhere = recorded
    rows = list_runs(open_store(url))
    assert [r["run_id"] for r in rows] == ["run-b", "run-a", "run-c"]
    by_id = {r["run_id"]: r for r in rows}
    assert (by_id["run-a"]["status"], by_id["run-a"]["step"], by_id["run-a"]["steps"]) == ("finished", 300, 300)
    assert by_id["run-a"]["storage"] == str(elsewhere / "run-a")
    assert (by_id["run-b"]["status"], by_id["run-b"]["step"]) == ("running", 120)
    assert (by_id["run-c"]["status"], by_id["run-c"]["step"]) == ("stale", 40)  # killed: no news for an hour


def test_runs_command_prints_every_run_and_json(recorded, tmp_path):
    url, _ = recorded
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), CMDARE_DB_URL=url)
    res = subprocess.run([CMDARE, "runs"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert all(run in res.stdout for run in ("run-a", "run-b", "run-c")) and "stale" in res.stdout
    res = subprocess.run([CMDARE, "runs", "--json", "--limit", "1"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert [r["run_id"] for r in json.loads(res.stdout)] == ["run-b"]


def test_runs_show_reads_the_heartbeat_from_the_recorded_storage(recorded):
    url, elsewhere = recorded
    write_status(run_storage("run-a", str(elsewhere)), "running", 2, 250)
    status = run_status("run-a", None, url)
    assert status["storage"] == str(elsewhere / "run-a")
    assert (status["status"], status["global_step"], status["shards"]) == ("running", 250, 2)
    assert status["heartbeat_age_s"] < STALE_AFTER_S and status["model"] == "resnet15"


def test_a_masked_password_is_never_used_as_storage_and_an_unknown_run_is_one_line(recorded):
    from cmdare.errors import DataNotFoundError

    url, elsewhere = recorded
    assert recorded_storage("run-a", url) == str(elsewhere)
    assert recorded_storage("run-c", url) is None and recorded_storage("run-x", url) is None
    with pytest.raises(DataNotFoundError, match="no run run-x: not in the store"):
        run_status("run-x", None, url)


def test_resume_and_ps_use_the_storage_the_run_was_recorded_with(recorded, tmp_path):
    """Before: ``--resume run-a`` looked in the data directory and said nothing was there to resume."""
    url, elsewhere = recorded
    env = dict(os.environ, CMDARE_HOME=str(tmp_path / "home"), CMDARE_DB_URL=url)
    env.pop("CMDARE_STORAGE", None)
    res = subprocess.run([CMDARE, "train", "--resume", "run-a", "--no-record"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 1 and str(elsewhere / "run-a") in res.stderr, res.stderr
    res = subprocess.run([CMDARE, "ps", "add", "run-a"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1 and str(elsewhere / "run-a") in res.stderr, res.stderr


def _killed_driver(where, step: int) -> None:
    """A driver that wrote its heartbeat (``running`` at ``step``) and was killed with ``kill -9``."""
    code = ("import os, signal, sys\nfrom cmdare.train.runtime.run_files import write_status\n"
            f"write_status(sys.argv[1], 'running', 1, {step})\nos.kill(os.getpid(), signal.SIGKILL)\n")
    res = subprocess.run([sys.executable, "-c", code, str(where)], capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr


@pytest.mark.parametrize(("beat_step", "step", "source"), [(250, 300, "the store"), (400, 400, "heartbeat")])
def test_runs_and_runs_show_agree_after_kill_9_of_the_driver(tmp_path, beat_step, step, source):
    """Issue 42: after `kill -9` of the driver `runs show` said `running` (its heartbeat was fresh) while `runs` said
    `stale`, and each showed its own step (the heartbeat's, the store's)."""
    url, root = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "storage"
    now = time.time()
    store = open_store(url)
    store.insert_rows("runs", [{"run_id": "run-k", "config": {"steps": 900, "storage": str(root)}, "model": "resnet8",
                                "dataset": "digits", "status": "running", "started_at": now - 60, "emulated": True,
                                "ended_at": None, "final_step": None, "final_accuracy": None, "cost_usd": None}])
    store.insert_rows("step_metrics", [{"run_id": "run-k", "time": now - 5, "global_step": 300, "worker_id": 0,
                                        "steps": 5, "duration_s": 0.1}])
    store.close()
    _killed_driver(run_storage("run-k", str(root)), beat_step)
    listed = list_runs(open_store(url))[0]
    shown = run_status("run-k", None, url)
    assert (listed["status"], shown["status"]) == ("stale", "stale")  # before: runs show said running
    assert listed["step"] == shown["global_step"] == step and source in shown["step_source"]
    text = subprocess.run([CMDARE, "runs", "show", "run-k", "--db", url], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, CMDARE_HOME=str(tmp_path))).stdout
    assert "status: stale" in text and f"trained to step: {step} (from {source}" in text, text
    assert "stored step (newest checkpoint, where a resume continues): -" in text, text


def test_runs_says_how_many_of_the_runs_it_shows(tmp_path):
    """Issue 12: `cmdare runs` showed 20 of 31 runs without saying so."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    keys = ("dataset", "ended_at", "final_step", "final_accuracy", "cost_usd")
    store.insert_rows("runs", [{**dict.fromkeys(keys), "run_id": f"run-{i:02d}", "config": {"steps": 10},
                                "model": "resnet8", "status": "finished", "started_at": 1.8e9 + i, "emulated": True}
                               for i in range(23)])
    store.close()
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), CMDARE_DB_URL=url)
    out = subprocess.run([CMDARE, "runs"], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "showing 20 of 23 runs; --all / --limit N" in out and "run-22" in out and "run-02" not in out, out
    out = subprocess.run([CMDARE, "runs", "--all"], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "run-00" in out and "run-22" in out and "showing" not in out, out
    out = subprocess.run([CMDARE, "runs", "--limit", "5"], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "showing 5 of 23 runs" in out, out
