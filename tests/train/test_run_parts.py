"""One set of counts across resumes (issue 42), through the CLI: a run of a user's own model, then its resume; the
end-of-run summary, `cmdare runs`, `cmdare runs show` and `cmdare report run` show each part and the run in all, and
the totals are the sums of the parts everywhere. `report run` of a user's model shows its test loss and metrics.
(The same through the Python API, in the fast tier: test_run_parts_api.py.)

Before: after a resume `cmdare runs` showed the second part's cost only, `report run` showed that part's cost beside
the whole run's revocations, and `report run` of any run of a user's own model ended in `TypeError: float() argument
must be a string or a real number, not 'NoneType'`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # two `cmdare train` runs on Ray (about a minute on 2 cores): the long tier

PROJECT = Path(__file__).parents[1] / "workloads" / "user_project"
CMDARE = str(Path(sys.executable).parent / "cmdare")
USER_MODEL = ["--model", "mypkg.tasks:build_regressor", "--dataset", "mypkg.tasks:vectors", "--loss", "mypkg.tasks:mse",
              "--metric", "mypkg.tasks:mae"]


def _cli(env: dict[str, str], *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CMDARE, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A 60-step run of the user's regression, slot 0 revoked about steps 40 and 100 (emulated cloud time 0.02 s a
    worker step; the resumed part goes on with the first part's emulated timeline), then its resume to step 120:
    (env, run id, stdout of each part)."""
    home = tmp_path_factory.mktemp("parts")
    env = dict(os.environ, CMDARE_HOME=str(home), PYTHONPATH=str(PROJECT), COLUMNS="200")
    env.pop("CMDARE_STORAGE", None)
    first = _cli(env, "train", *USER_MODEL, "--workers", "2", "--ps", "1", "--steps", "60", "--transient",
                 "--revocations", "trace=0.4@0+1.0@0,step=0.02", "--startup", "0", "--checkpoint-every", "30",
                 "--eval-every", "30", "--tensorboard", "none")
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = re.search(r"run (\S+) finished: step 60", first.stdout).group(1)
    second = _cli(env, "train", "--resume", run_id, "--steps", "120", "--tensorboard", "none")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"run {run_id} finished: step 120" in second.stdout, second.stdout
    return env, run_id, first.stdout, second.stdout


def _part_figures(out: str) -> tuple[int, int, float]:
    """Revoked, replaced and cost of the part a `cmdare train` printed."""
    m = re.search(r"servers(?:, this part)?: (\d+) revoked, (\d+) replaced, .*cost (?:so far|of this part) "
                  r"\$([\d.]+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), float(m.group(3))


def test_every_view_shows_the_run_in_all_as_the_sum_of_its_parts(resumed):
    env, run_id, first, second = resumed
    r1, p1, c1 = _part_figures(first)
    r2, p2, c2 = _part_figures(second)
    assert r1 >= 1 and r2 >= 1 and c1 > 0 and c2 > 0, (first, second)
    total = re.search(r"in all, 2 parts \(steps 0-60, 60-120\): 120 steps trained in ([\d.]+) s; (\d+) revoked, "
                      r"(\d+) replaced, .*cost \$([\d.]+)", second)
    assert total, second
    assert (int(total.group(2)), int(total.group(3))) == (r1 + r2, p1 + p2)
    assert float(total.group(4)) == pytest.approx(c1 + c2, abs=2e-4)  # printed to 4 decimals

    listed = json.loads(_cli(env, "runs", "--json").stdout)
    row = next(r for r in listed if r["run_id"] == run_id)
    assert (row["status"], row["step"], row["parts"]) == ("finished", 120, 2)
    assert (row["revocations"], row["replacements"]) == (r1 + r2, p1 + p2)
    assert row["cost_usd"] == pytest.approx(c1 + c2, abs=2e-4)
    parts = row["part_list"]
    assert [(p["from_step"], p["to_step"], p["status"]) for p in parts] == [(0, 60, "finished"), (60, 120, "finished")]
    assert row["cost_usd"] == pytest.approx(sum(p["cost_usd"] for p in parts), rel=1e-9)
    assert row["wall_s"] == pytest.approx(sum(p["wall_s"] for p in parts), rel=1e-9)
    assert row["revocations"] == sum(p["revocations"] for p in parts)

    shown = json.loads(_cli(env, "runs", "show", run_id, "--json").stdout)
    assert (shown["status"], shown["global_step"], shown["latest_checkpoint_step"]) == ("finished", 120, 120)
    assert {k: shown[k] for k in ("cost_usd", "revocations", "replacements", "parts")} == \
        {k: row[k] for k in ("cost_usd", "revocations", "replacements", "parts")}
    text = _cli(env, "runs", "show", run_id).stdout
    assert "trained to step: 120 (from the run's end)" in text and "part 2: steps 60-120, finished" in text, text

    report = _cli(env, "report", "run", run_id, "--format", "json")
    assert report.returncode == 0, report.stderr[-2000:]
    tables = json.loads(report.stdout)["tables"]
    summary = {r["field"]: r["value"] for r in tables["summary"]}
    assert (int(summary["parts"]), int(summary["global_step"]), int(summary["steps_trained"])) == (2, 120, 120)
    assert (int(summary["revocations"]), int(summary["replacements"])) == (r1 + r2, p1 + p2)
    assert float(summary["cost_usd"]) == pytest.approx(row["cost_usd"], rel=1e-9)
    assert float(summary["wall_s"]) == pytest.approx(row["wall_s"], rel=1e-9)
    assert [int(p["part"]) for p in tables["parts"]] == [1, 2]


def test_report_run_of_a_users_model_shows_its_test_loss_and_metrics(resumed):
    env, run_id, _, second = resumed
    report = _cli(env, "report", "run", run_id)
    assert report.returncode == 0, report.stderr[-2000:]  # before: TypeError, exit 1
    assert "final_loss" in report.stdout and "test_metrics" in report.stdout
    loss, mae = re.search(r"test loss ([\d.e+-]+), mae ([\d.e+-]+)", second).group(1, 2)
    summary = {r["field"]: r["value"] for r in json.loads(
        _cli(env, "report", "run", run_id, "--format", "json", "--table", "summary").stdout)["tables"]["summary"]}
    assert "final_accuracy" not in summary
    assert float(summary["final_loss"]) == pytest.approx(float(loss), rel=1e-3)
    assert summary["test_metrics"] == f"mae {float(mae):.4g}"
