"""Tables are not cut when piped (issue 42: ``confi…``, ``accur…`` in ``cmdare plan | less``): every console is
built by :func:`cmdare.console.console`, which has no width limit when its output is not a terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.table import Table

from cmdare.console import UNLIMITED_WIDTH, console

SRC = Path(__file__).resolve().parents[1] / "src" / "cmdare"
CMDARE = Path(sys.executable).parent / "cmdare"


def test_a_console_that_is_not_a_terminal_has_no_width_limit(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    piped = console(file=out)
    assert piped.width == UNLIMITED_WIDTH
    table = Table()
    for name in ("configuration", "accuracy P5", "lifetime model"):
        table.add_column(name)
    table.add_row("8xT4 spot + 2 PS @us-east1 " * 4, "88.6%", "exponential 12%/month (gcp spot, assumption)")
    piped.print(table)
    assert "…" not in out.getvalue() and "configuration" in out.getvalue()
    assert max(len(line) for line in out.getvalue().splitlines()) < 300  # the table's width, not the console's
    assert console(file=io.StringIO(), width=90).width == 90  # asked for: kept
    monkeypatch.setenv("COLUMNS", "120")
    assert console(file=io.StringIO()).width == 120  # the user's COLUMNS: kept


def test_no_command_builds_a_console_of_its_own_width():
    """One place decides the width: no module asks Rich for a fixed one (the 80/160/200 of before)."""
    offenders = [f"{path.relative_to(SRC)}:{n}" for path in SRC.rglob("*.py")
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if "Console(" in line and "width=" in line and "make_console().width" not in line]
    assert offenders == []


@pytest.mark.skipif(not CMDARE.exists(), reason="cmdare entry point not installed next to this Python")
def test_a_piped_plan_table_keeps_its_headers_whole(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "CMDARE_DB_URL")}
    env["CMDARE_HOME"] = str(tmp_path / "home")
    res = subprocess.run([str(CMDARE), "plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline", "2h",
                          "--max-workers", "2", "--runs", "3"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    header = next(line for line in res.stdout.splitlines() if "configuration" in line)
    assert "…" not in res.stdout
    for name in ("configuration", "time P95", "cost P95", "revocations", "accuracy P5", "lifetime model"):
        assert name in header
