"""The command line a newcomer meets first (issue 30): one plain line per mistake, found before torch or Ray
load, with a suggestion for a misspelt name; usage errors as one line too; ``--version``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CMDARE = str(Path(sys.executable).parent / "cmdare")

# Runs the CLI in this interpreter and reports, after it exits, whether torch or ray had been imported.
_PROBE = """
import sys
from cmdare.cli import main
sys.argv = ["cmdare", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    code = done.code
print("loaded:", sorted(m for m in ("torch", "ray") if m in sys.modules), "exit:", code)
"""


def _cli(args, home, probe=False):
    env = dict(os.environ, CMDARE_HOME=str(home))
    cmd = [sys.executable, "-c", _PROBE, *args] if probe else [CMDARE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["train", "--model", "resnt15"], "error: unknown model 'resnt15' (did you mean 'resnet15'?); valid:"),
    (["train", "--dataset", "digit"], "error: unknown dataset 'digit' (did you mean 'digits'?)"),
    (["train", "--workers", "-1"], "error: --workers must be at least 1, got -1"),
    (["train", "--placement", "rond-robin"], "error: unknown placement 'rond-robin' (did you mean 'round-robin'?)"),
    (["train", "--gpu", "v10"], "error: unknown GPU type 'v10'"),
    (["train", "--region", "nowhere-1"], "error: unknown gcp region 'nowhere-1'"),
    (["train", "--revocations", "every=-2"], "error: --revocations: "),
    (["train", "--replace", "sometimes"], "error: unknown replacement policy 'sometimes'"),
    (["train", "--dataset", "cifar10", "--data-dir", "/no/such/dir"], "error: CIFAR-10 directory not found"),
    (["train", "--storage", "memory://ckpt"], "error: --storage memory://ckpt keeps checkpoints in this process"),
    (["train", "--lr", "nan"], "error: --lr must be"),
])
def test_a_mistake_is_one_line_found_before_torch_or_ray_load(tmp_path, args, message):
    """Before: each took 3-11 s (torch imported first); ``--workers -1`` said ``unknown GPU type '-1'``; no
    suggestion for a misspelt name."""
    res = _cli(args, tmp_path, probe=True)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), res.stderr
    assert res.stdout.strip() == "loaded: [] exit: 1", res.stdout


def test_storage_that_is_a_file_is_one_line(tmp_path):
    """Before: a NotADirectoryError traceback."""
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    res = _cli(["train", "--storage", str(a_file), "--steps", "5"], tmp_path, probe=True)
    assert res.stderr.strip() == f"error: --storage {a_file} is a file: give a directory or a URL such as " \
                                 "s3://bucket/prefix", res.stderr
    assert "loaded: []" in res.stdout


@pytest.mark.parametrize("args, message, command", [
    (["plan", "simulate", "--workers", "k80:8"], "Missing option '--model'.", "cmdare plan simulate --help"),
    (["train", "--bogus"], "No such option: --bogus", "cmdare train --help"),
    (["no-such-command"], "No such command 'no-such-command'.", "cmdare --help"),
])
def test_usage_errors_are_one_plain_line_with_exit_status_2(tmp_path, args, message, command):
    """Before: Typer's boxed panel over several lines."""
    res = _cli(args, tmp_path)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}") and lines[0].endswith(f"(see '{command}')"), \
        res.stderr
    assert "╭" not in res.stderr


def test_a_group_without_its_command_shows_its_help(tmp_path):
    res = _cli(["report"], tmp_path)
    assert res.returncode == 2 and "Usage: cmdare report" in res.stdout + res.stderr
    assert "error:" not in res.stderr


def test_version(tmp_path):
    from cmdare import __version__

    res = _cli(["--version"], tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == f"cmdare {__version__}"


def test_error_text_is_plain_text_not_markup(capsys):
    """Before: Rich markup ate ``[s3]`` in ``pip install 'cmdare[s3]'``."""
    from cmdare.cli import print_error

    print_error("storage s3://b/p needs s3fs: pip install 'cmdare[s3]'\nand [bold]more[/bold]")
    assert capsys.readouterr().err == "error: storage s3://b/p needs s3fs: pip install 'cmdare[s3]' and " \
                                      "[bold]more[/bold]\n"


def test_builtin_model_names_without_torch_are_the_zoo():
    from cmdare.workloads import list_models
    from cmdare.workloads.families import builtin_model_names

    assert builtin_model_names() == [m for m in list_models() if m in builtin_model_names()]
    assert set(builtin_model_names()) <= set(list_models())
