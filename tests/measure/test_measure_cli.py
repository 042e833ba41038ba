"""``cmdare import`` / ``cmdare report``: in-process through Typer's runner, plus end-to-end subprocesses.

Every ``cmdare`` process pays the whole CLI's import time (several seconds on a loaded 2-core machine),
so only the error path of the real entry point runs as subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from measure_testdata import CMDARE_DIR, LIFETIME_JSON, SHARED_DATA, needs_data
from typer.testing import CliRunner

from cmdare.cli import app
from cmdare.errors import CmdareError

CMDARE = Path(sys.executable).parent / "cmdare"
pytestmark = needs_data
runner = CliRunner()


def invoke(*args: str, db: str, env: dict | None = None):
    return runner.invoke(app, list(args), env={"CMDARE_DB_URL": db, "CMDARE_SHARED_DATA": "", **(env or {})})


def assert_user_error(result, fragment: str) -> None:
    """The CLI's main() prints a CmdareError as one 'error: ...' line and exits 1."""
    assert isinstance(result.exception, CmdareError), result.output
    assert "\n" not in str(result.exception) and fragment in str(result.exception)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('cli') / 'cmdare.db'}"


@pytest.mark.skipif(not CMDARE.exists(), reason="cmdare entry point not installed")
def test_entry_point_errors_are_one_line(tmp_path):
    env = {**os.environ, "CMDARE_DB_URL": f"sqlite:///{tmp_path / 'e.db'}", "COLUMNS": "250"}
    trunc = tmp_path / "t.json"
    trunc.write_bytes(LIFETIME_JSON.read_bytes()[:1000])
    script = f"{CMDARE} report lifetimes; echo rc=$?; {CMDARE} import lifetimes {trunc}; echo rc=$?"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.stdout.count("rc=1") == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    err = " ".join(proc.stderr.split())
    assert "error: no lifetime observations in the store" in err and "cmdare import lifetimes" in err
    assert "truncated JSON" in err


def test_report_on_empty_store_names_the_import(db):
    assert_user_error(invoke("report", "lifetimes", db=db), "cmdare import lifetimes")


def test_import_then_reports_with_plots(db, tmp_path):
    res = invoke("import", "public", db=db, env={"CMDARE_SHARED_DATA": str(SHARED_DATA)})
    assert res.exit_code == 0, res.output
    assert "rows read" in res.output and "skipped 208: duplicate" in res.output
    again = invoke("import", "cmdare", str(CMDARE_DIR), "--json", db=db)
    doc = json.loads(again.output)
    assert doc["imported"] == 0 and doc["read"] > 5000
    for name in ("scaling", "startup", "checkpoint"):
        png = tmp_path / f"{name}.png"
        res = invoke("report", name, "--plot", str(png), db=db)
        assert res.exit_code == 0, res.output
        assert png.stat().st_size > 10_000 and "plot written" in res.output
    scaling = invoke("report", "scaling", "--format", "csv", db=db)
    assert scaling.output.splitlines()[0].startswith("gpu_type,model,ps,workers,steps_per_s")
    startup = json.loads(invoke("report", "startup", "--format", "json", db=db).output)
    assert startup["report"] == "startup" and startup["tables"]["by_market"]
    models = tmp_path / "models"
    res = invoke(
        "report",
        "lifetimes",
        "--format",
        "json",
        "--plot",
        str(tmp_path / "l.png"),
        "--save-models",
        str(models),
        db=db,
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "l.png").stat().st_size > 10_000
    from cmdare.measure.lifetime_models import load_lifetime_model

    assert load_lifetime_model(str(models / "bathtub-cpu.json")).name == "bathtub"
    assert (models / "empirical-k80.json").exists()


def test_bad_inputs_are_one_line_errors(db, tmp_path):
    assert_user_error(invoke("import", "lifetimes", str(tmp_path / "none.csv"), db=db), "not found")
    wrong = tmp_path / "w.csv"
    wrong.write_text("a,b\n1,2\n")
    assert_user_error(invoke("import", "tensorboard", str(wrong), "--run", "r", db=db), "missing column")
    assert_user_error(invoke("import", "cmdare", db=db), "CMDARE_SHARED_DATA")
    assert_user_error(invoke("report", "scaling", "--format", "xml", db=db), "valid: table, csv, json")
    assert_user_error(invoke("report", "run", "nope", db=db), "no run 'nope'")
    assert_user_error(invoke("report", "lifetimes", db="postgresql+psycopg2://x@127.0.0.1:1/none"), "cannot open store")
