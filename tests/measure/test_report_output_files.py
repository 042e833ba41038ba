"""``cmdare report ... --plot FILE`` and ``--save-models DIR`` write as every user-named file is written (issue 42,
item 11: ``report checkpoint --plot /proc/x.png`` ended in a traceback; an existing file was replaced)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cmdare.cli import app
from cmdare.errors import UserInputError

CMDARE = Path(sys.executable).parent / "cmdare"
runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('reports') / 'cmdare.db'}"


def invoke(*args: str, db: str):
    return runner.invoke(app, list(args), env={"CMDARE_DB_URL": db, "CMDARE_SHARED_DATA": ""})


def refused(result, fragment: str) -> bool:
    err = result.exception
    return isinstance(err, UserInputError) and fragment in str(err) and "\n" not in str(err)


def test_a_plot_is_written_only_where_it_can_be_and_never_over_a_file(db, tmp_path):
    png = tmp_path / "c.png"
    png.write_bytes(b"mine")
    link = tmp_path / "link.png"
    link.symlink_to(png)
    (tmp_path / "FILE").write_text("")
    for path, fragment in [("/proc/x.png", "cannot write into /proc"), ("/dev/full", "character device"),
                           (str(tmp_path / "FILE" / "x.png"), "is a file, not a directory"),
                           (str(png), "exists: give --force"), (str(link), "is a symbolic link"),
                           (str(tmp_path / "c.foo"), "matplotlib cannot write .foo")]:
        res = invoke("report", "checkpoint", "--plot", path, db=db)
        assert refused(res, fragment), (path, res.output)
    assert png.read_bytes() == b"mine" and link.is_symlink()
    res = invoke("report", "checkpoint", "--plot", str(png), "--force", db=db)
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "c.svg"
    assert invoke("report", "startup", "--plot", str(svg), db=db).exit_code == 0
    assert svg.read_text().lstrip().startswith("<?xml")  # the suffix names the format
    assert not list(tmp_path.glob(".cmdare-*"))


def test_saved_models_never_replace_files_without_force(db, tmp_path):
    (tmp_path / "FILE").write_text("")
    assert refused(invoke("report", "lifetimes", "--save-models", str(tmp_path / "FILE"), db=db), "is a file")
    assert refused(invoke("report", "lifetimes", "--save-models", str(tmp_path / "FILE" / "m"), db=db),
                   "is a file, not a directory")
    models = tmp_path / "models"
    assert invoke("report", "lifetimes", "--save-models", str(models), db=db).exit_code == 0
    first = {p.name: p.read_bytes() for p in models.iterdir()}
    assert "bathtub-cpu.json" in first
    (models / "bathtub-cpu.json").write_text("mine")
    assert refused(invoke("report", "lifetimes", "--save-models", str(models), db=db), "exists: give --force")
    assert (models / "bathtub-cpu.json").read_text() == "mine"
    assert invoke("report", "lifetimes", "--save-models", str(models), "--force", db=db).exit_code == 0
    assert {p.name: p.read_bytes() for p in models.iterdir()} == first


@pytest.mark.skipif(not CMDARE.exists(), reason="cmdare entry point not installed")
def test_the_entry_point_refuses_an_unwritable_plot_in_one_line(tmp_path):
    env = {**os.environ, "CMDARE_DB_URL": f"sqlite:///{tmp_path / 'e.db'}", "CMDARE_HOME": str(tmp_path)}
    res = subprocess.run([str(CMDARE), "report", "checkpoint", "--plot", "/proc/x.png"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --plot /proc/x.png: cannot write into /proc"), res.stderr
