"""The real ``cmdare`` entry point (``cmdare.cli.main``) run in the test's own process: no interpreter start and
no import of the CLI per call. ``tests/`` is on ``sys.path`` (its conftest), so any test imports this module."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path


def run_cmdare(home: str | Path, *args: str) -> tuple[int, str, str]:
    """``cmdare ARGS`` with ``CMDARE_HOME=home``: (exit status, stdout, stderr). An exception that main() does not
    turn into an ``error:`` line propagates (fails the test)."""
    from cmdare import cli

    old_argv, old_home = sys.argv, os.environ.get("CMDARE_HOME")
    sys.argv, os.environ["CMDARE_HOME"] = ["cmdare", *args], str(home)
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        sys.argv = old_argv
        if old_home is None:
            os.environ.pop("CMDARE_HOME", None)
        else:
            os.environ["CMDARE_HOME"] = old_home
    return code, out.getvalue(), err.getvalue()


def one_error(result: tuple[int, str, str], fragment: str) -> bool:
    """Exit status 1 and one ``error: ...`` line on stderr that holds ``fragment``."""
    code, _, err = result
    lines = err.strip().splitlines()
    return code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
