"""``cmdare workloads``: table and JSON output, one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cmdare.errors import UserInputError
from cmdare.workloads import list_models
from cmdare.workloads.commands import register

CMDARE = Path(sys.executable).with_name("cmdare")


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Group so that ``workloads`` is a sub-command."""

    register(app)
    return app


def test_json_lists_every_model_with_its_figures() -> None:
    result = CliRunner().invoke(_app(), ["workloads", "--input-shape", "1,8,8", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == list_models()
    assert all(r["input_shape"] == [1, 8, 8] and r["num_params"] > 0 and r["checkpoint_bytes"] > 0 for r in rows)
    assert all(r["flops_per_sample_train"] == 3 * r["flops_per_sample_forward"] for r in rows)


def test_table_for_selected_models() -> None:
    result = CliRunner().invoke(_app(), ["workloads", "-m", "resnet32", "-m", "shake_shake_small"])
    assert result.exit_code == 0, result.output
    assert "resnet32" in result.output and "464,154" in result.output
    assert "shake_shake_small" in result.output and "resnet8 " not in result.output


def test_registered_in_the_main_cli() -> None:
    from cmdare.cli import app

    result = CliRunner().invoke(app, ["workloads", "-m", "resnet8", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["num_params"] == 75_290


def test_unknown_model_is_a_one_line_error_from_the_real_command() -> None:
    bad = subprocess.run([str(CMDARE), "workloads", "-m", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: unknown model 'nope'") and "Traceback" not in bad.stderr
    assert bad.stdout == ""


@pytest.mark.parametrize("args", [["--input-shape", "3,x,32"], ["--input-shape", "3,4,4"], ["--input-shape", "3,32"],
                                  ["--format", "xml"], ["-m", "resnet8", "-m", "vgg"]])  # fmt: skip
def test_bad_input_raises_user_errors(args: list[str]) -> None:
    result = CliRunner().invoke(_app(), ["workloads", *args])  # CliRunner: exit code 1 for any exception
    assert isinstance(result.exception, UserInputError), result.exception


def test_the_cli_imports_neither_torch_nor_ray_until_a_command_needs_them():
    code = "import sys, cmdare.cli; print(sorted(m for m in ('torch', 'ray', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # `cmdare --help` stays fast
