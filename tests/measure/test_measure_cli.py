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
from measure_testdata import CMDARE_DIR, LIFETIME_JSON, PUBLIC_DATA
from typer.testing import CliRunner

from cmdare.cli import app
from cmdare.errors import CmdareError

CMDARE = Path(sys.executable).parent / "cmdare"
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
    script = f"{CMDARE} report run run-nope; echo rc=$?; {CMDARE} import lifetimes {trunc}; echo rc=$?"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.stdout.count("rc=1") == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    err = " ".join(proc.stderr.split())
    assert "error: no run 'run-nope' in the store" in err
    assert "truncated JSON" in err


def test_report_on_empty_store_imports_the_bundled_data(tmp_path):
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    first = invoke("report", "lifetimes", "--format", "json", db=db)
    assert first.exit_code == 0, first.output
    assert "imported" in first.stderr and "bundled with cmdare" in first.stderr and "CM-DARE" in first.stderr
    assert json.loads(first.stdout)["report"] == "lifetimes"  # stdout stays pure JSON
    again = invoke("report", "scaling", db=db)  # the first report imported all the public data, once
    assert again.exit_code == 0 and "imported" not in again.stderr, again.output
    from cmdare.measure.store import open_store

    counts = open_store(db).counts()
    assert counts["lifetime_observations"] > 1500 and counts["imports"] > 90


def test_import_public_defaults_to_the_bundled_data(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = invoke("import", "public", db=db)
    assert res.exit_code == 0, res.output
    assert "skipped 208: duplicate" in res.output and "error" not in res.output
    again = invoke("import", "public", "--json", db=db)
    decoder, text, docs = json.JSONDecoder(), again.stdout.strip(), []
    while text:
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    assert len(docs) == 2 and [d["imported"] for d in docs] == [0, 0] and docs[0]["read"] > 5000


def test_import_then_reports_with_plots(db, tmp_path):
    res = invoke("import", "public", db=db, env={"CMDARE_SHARED_DATA": str(PUBLIC_DATA)})
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
    scaling = invoke("report", "scaling", "--format", "csv", "--table", "speeds", db=db)
    assert scaling.output.splitlines()[0].startswith("gpu_type,model,ps,workers,steps_per_s")
    every = invoke("report", "scaling", "--format", "csv", db=db).output  # issue 30: every table, not the first
    sections = [line[2:] for line in every.splitlines() if line.startswith("# ")]
    assert sections[0] == "speeds" and len(sections) == len(json.loads(
        invoke("report", "scaling", "--format", "json", db=db).output)["tables"]) > 1
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
    no_data = {"CMDARE_SHARED_DATA": str(tmp_path)}  # an override without cmdare/ is named, never ignored
    assert_user_error(invoke("import", "cmdare", db=db, env=no_data), "CMDARE_SHARED_DATA")
    assert_user_error(invoke("report", "scaling", "--format", "xml", db=db), "valid: table, csv, json")
    assert_user_error(invoke("report", "run", "nope", db=db), "no run 'nope'")
    assert_user_error(invoke("report", "lifetimes", db="postgresql+psycopg2://x@127.0.0.1:1/none"), "cannot open store")
