"""One set of counts across resumes, through the Python API (issue 42): a 20-step run of a user's own model with a
revocation, recorded by the real recorder into a real SQLite store, then its resume to step 40. The summary's totals,
`list_runs` (what `cmdare runs` prints), `run_status` (`cmdare runs show`) and `report run` agree, and each is the sum
of the parts. `report run` of the user's model shows its test loss and metric.

Before: the store kept the second part's cost only (the first part's was overwritten), `report run` counted the
whole run's revocations beside it, and `report run` of a user's model ended in `TypeError: float() argument must be a
string or a real number, not 'NoneType'`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.reports import build_report
from cmdare.measure.store import open_store
from cmdare.train import Trainer, TrainSpec
from cmdare.train.cli.runs_cmd import list_runs, run_status

PROJECT = Path(__file__).parents[1] / "workloads" / "user_project"


@pytest.fixture(scope="module")
def user_ray():
    """A local Ray whose workers import the user's project (as `PYTHONPATH=...` does for `cmdare train`)."""
    import ray

    sys.path.insert(0, str(PROJECT))
    path = os.pathsep.join(filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))
    ray.init(address="local", num_cpus=6, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()
    sys.path.remove(str(PROJECT))


def _spec(steps: int) -> TrainSpec:
    # emulated cloud time 0.02 s a worker step: slot 0 is revoked about steps 10 and 30 (the second part goes on with
    # the first part's emulated fleet and timeline, as a resumed emulated run does)
    return TrainSpec(model="mypkg.tasks:build_regressor", dataset="mypkg.tasks:vectors", loss="mypkg.tasks:mse",
                     metric="mypkg.tasks:mae", workers=2, ps=1, steps=steps, batch_size=16, checkpoint_every=10,
                     eval_every=10, seed=1, transient=True, revocations="trace=0.1@0+0.3@0,step=0.02", startup="0")


@pytest.fixture(scope="module")
def resumed(user_ray, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parts-api")
    url = f"sqlite:///{tmp / 'store.db'}"
    where = tmp / "storage" / "run-parts"  # the run's own location under the storage root
    first = Trainer(_spec(20), [StoreRecorder(url)], run_id="run-parts", checkpoint_dir=where).run()
    second = Trainer(_spec(40), [StoreRecorder(url)], run_id="run-parts", resume=True, checkpoint_dir=where).run()
    return url, first, second


def test_the_totals_are_the_sums_of_the_parts_in_the_summary_the_listing_the_status_and_the_report(resumed):
    url, first, second = resumed
    assert (first.status, first.global_step, second.status, second.global_step) == ("finished", 20, "finished", 40)
    assert first.revocations >= 1 and second.revocations >= 1 and first.cost_usd > 0 and second.cost_usd > 0
    parts = second.details["parts"]
    assert [(p["part"], p["from_step"], p["to_step"], p["status"]) for p in parts] == \
        [(1, 0, 20, "finished"), (2, 20, 40, "finished")]
    assert parts[0]["cost_usd"] == pytest.approx(first.cost_usd) and parts[1]["cost_usd"] == second.cost_usd
    totals = second.details["totals"]
    assert totals["cost_usd"] == pytest.approx(first.cost_usd + second.cost_usd)
    assert (totals["revocations"], totals["replacements"]) == (first.revocations + second.revocations,
                                                              first.replacements + second.replacements)
    assert totals["wall_s"] == pytest.approx(first.wall_s + second.wall_s)
    assert (totals["steps_trained"], totals["global_step"], totals["parts"]) == (40, 40, 2)

    store = open_store(url)
    row = list_runs(store)[0]
    assert (row["status"], row["step"], row["parts"]) == ("finished", 40, 2)
    for key in ("cost_usd", "revocations", "replacements", "wall_s"):
        assert row[key] == pytest.approx(totals[key]), key
    status = run_status("run-parts", str(Path(first.details["checkpoint_dir"]).parent), url)
    assert (status["status"], status["global_step"], status["latest_checkpoint_step"]) == ("finished", 40, 40)
    for key in ("cost_usd", "revocations", "replacements", "wall_s", "parts"):
        assert status[key] == pytest.approx(row[key]), key

    report = build_report("run", store, run_id="run-parts")
    summary = dict(zip(report.tables["summary"].field, report.tables["summary"].value, strict=True))
    assert (int(summary["parts"]), int(summary["global_step"]), int(summary["steps_trained"])) == (2, 40, 40)
    assert (int(summary["revocations"]), int(summary["replacements"])) == (totals["revocations"],
                                                                           totals["replacements"])
    assert float(summary["cost_usd"]) == pytest.approx(totals["cost_usd"])
    assert float(summary["wall_s"]) == pytest.approx(totals["wall_s"])
    assert report.tables["parts"].part.tolist() == [1, 2]
    store.close()


def test_report_run_of_a_users_model_shows_its_test_loss_and_metric(resumed):
    url, _, second = resumed
    store = open_store(url)
    report = build_report("run", store, run_id="run-parts")  # before: TypeError (float(None))
    summary = dict(zip(report.tables["summary"].field, report.tables["summary"].value, strict=True))
    assert "final_accuracy" not in summary  # the task measures no accuracy
    assert float(summary["final_loss"]) == pytest.approx(second.final_loss)
    assert summary["test_metrics"] == f"mae {second.details['test_metrics']['mae']:.4g}"
    assert "final_loss" in report.render("table")
    store.close()


def test_report_run_against_plan_puts_the_run_beside_the_simulation_of_its_command_line(resumed):
    """`cmdare report run RUN --against-plan` (issue 43): the run's own options, read back from the store, simulated
    by the planner in the run's emulated cloud time: your own model profiled on a sample of your data."""
    from cmdare.run_simulation import against_plan

    url, _, second = resumed
    store = open_store(url)
    report = build_report("run", store, run_id="run-parts")
    against_plan(report, store, "run-parts", runs=20)
    table = report.tables["against_plan"].set_index("measure")
    totals = second.details["totals"]
    assert list(table.index) == ["cost_usd", "revocations", "replacements"]  # no time: emulated, not stored
    assert table.loc["cost_usd", "run"] == pytest.approx(totals["cost_usd"])
    assert table.loc["revocations", "run"] == totals["revocations"]
    # the trace revokes slot 0 at 0.1 and 0.3 emulated seconds in the simulated run, as over the real run's two parts
    assert table.loc["revocations", "simulated_mean"] == pytest.approx(2.0) == totals["revocations"]
    assert table.loc["cost_usd", "simulated_mean"] > 0
    assert any("emulated cloud time" in n and "2 parts" in n for n in report.notes)
    assert "against_plan" in report.render("table")
    store.close()


def test_report_run_shows_the_controllers_decisions_each_with_its_reason(resumed):
    """The decision history (issue 43): every command the controller gave but the feeding of workers, recorded as it
    was carried out, with why."""
    url, _, _ = resumed
    store = open_store(url)
    report = build_report("run", store, run_id="run-parts")
    decisions = report.tables["decisions"]
    assert list(decisions.columns) == ["t_s", "global_step", "command", "worker_id", "why"]
    assert "decision" not in set(report.tables["events"].kind)  # the events table stays the events
    said = list(zip(decisions.command, decisions.why, strict=True))
    assert ("StartWorker", "data slot 0 of the first wave") in said and ("SetChief", "the first chief") in said
    assert any(c == "Revoke" and "revocation schedule" in w for c, w in said)
    assert any(c == "LoseWorker" and w.startswith("revoked; replaced (same replacement)") for c, w in said)
    assert any(c == "StartWorker" and w.startswith("replaces worker ") for c, w in said)
    assert any(c == "StartDuty" and w == "every 10 steps" for c, w in said)
    assert said[-1][0] == "EndRun" and all(w for _, w in said)  # every decision says why
    assert "decisions" in report.render("table")
    store.close()


def test_against_plan_of_a_run_that_recorded_no_options_is_one_line(tmp_path):
    """A run the store holds without its training options (an imported run): nothing to simulate, said in one
    line, and the store is left as it was."""
    from cmdare.errors import UserInputError
    from cmdare.measure.store.schema import Run
    from cmdare.run_simulation import against_plan

    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    with store.session() as s:
        s.add(Run(run_id="imported", config={}, started_at=0.0, status="finished"))
    with pytest.raises(UserInputError, match="^run imported recorded no training options .*nothing to simulate$"):
        against_plan(None, store, "imported")
    with store.session() as s:
        assert s.get(Run, "imported").status == "finished"
    store.close()
