"""`cmdare catalog` and `cmdare cluster-config` through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from cmdare.cloud.commands import register
from cmdare.errors import CmdareError, DataFormatError, UnknownNameError, UserInputError

CMDARE = Path(sys.executable).parent / "cmdare"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    register(app)
    return app


@pytest.fixture(autouse=True)
def _no_env_catalog(monkeypatch):
    monkeypatch.delenv("CMDARE_CATALOG", raising=False)


def _run(app, *args: str):
    return CliRunner().invoke(app, list(args))


def test_catalog_table_and_json(app):
    table = _run(app, "catalog", "--gpu", "k80")
    assert table.exit_code == 0, table.output
    assert "K80" in table.output and "0.7230" in table.output and "[icac19]" in table.output
    assert "V100" not in table.output
    out = _run(app, "catalog", "--cloud", "aws", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert {o["cloud"] for o in doc["offerings"]} == {"aws"}
    p4d = next(o for o in doc["offerings"] if o["machine_type"] == "p4d.24xlarge")
    assert p4d["worker_on_demand_usd_per_h"] == pytest.approx(p4d["on_demand_usd_per_h"] / 8)
    assert [g["name"] for g in doc["gpus"]][:3] == ["K80", "P100", "V100"]


def test_catalog_override_flag(app, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("offerings:\n  - {cloud: gcp, region: us-east1, gpu: T4, spot_usd_per_h: 0.099,"
                    " source: quote, as_of: '2026-11-29'}\n")
    out = _run(app, "catalog", "--gpu", "t4", "--cloud", "gcp", "--region", "us-east1", "--format", "json",
                "--catalog", str(mine))
    assert out.exit_code == 0, out.output
    assert [o["spot_usd_per_h"] for o in json.loads(out.output)["offerings"]] == [0.099]
    bad = tmp_path / "bad.yaml"
    bad.write_text("offerings:\n  - {cloud: gcp, region: us-east1, gpu: T4, spot_usd_per_h: [1]}\n")
    out = _run(app, "catalog", "--catalog", str(bad))
    assert isinstance(out.exception, DataFormatError) and "spot_usd_per_h" in str(out.exception)


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        (["catalog", "--format", "xml"], UnknownNameError, "format 'xml'"),
        (["catalog", "--gpu", "b200"], UnknownNameError, "GPU type 'b200'"),
        (["catalog", "--region", "moon-1"], UnknownNameError, "region 'moon-1'"),
        (["cluster-config", "--cloud", "aws", "--gpu", "p100", "--workers", "4"], UnknownNameError, "P100"),
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--workers", "-3"], UserInputError, "--workers"),
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--ps", "0"], UserInputError, "--ps"),
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--region", "asia-x9"], UnknownNameError, "asia-x9"),
        (["cluster-config", "--cloud", "oracle", "--gpu", "k80"], UnknownNameError, "oracle"),
    ],
)
def test_bad_input_raises_cmdare_errors(app, args, error, needle):
    out = _run(app, *args)  # CliRunner gives exit code 1 for any exception: the exception is what counts
    assert isinstance(out.exception, error), out.output
    assert needle in str(out.exception) and "\n" not in str(out.exception)


def test_cluster_config_to_file_and_stdout(app, tmp_path):
    target = tmp_path / "cluster.yaml"
    out = _run(app, "cluster-config", "--cloud", "gcp", "--gpu", "k80", "--workers", "4", "--ps", "1",
               "--transient", "--output", str(target))
    assert out.exit_code == 0, out.output
    config = yaml.safe_load(target.read_text())
    assert config["available_node_types"]["cmdare_worker"]["node_config"]["scheduling"]["preemptible"] is True
    out = _run(app, "cluster-config", "--cloud", "aws", "--gpu", "v100", "--workers", "4", "--ps", "1", "--transient")
    assert out.exit_code == 0 and "MarketType: spot" in out.output
    out = _run(app, "cluster-config", "--cloud", "gcp", "--gpu", "t4", "--output", str(tmp_path / "no" / "x.yaml"))
    assert isinstance(out.exception, UserInputError)


@pytest.mark.skipif(not CMDARE.exists(), reason="cmdare entry point not installed next to this Python")
def test_real_entry_point_prints_one_line_errors_and_the_contract_output():
    bad = subprocess.run([str(CMDARE), "cluster-config", "--cloud", "aws", "--gpu", "p100", "--workers", "4",
                          "--transient"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "P100 servers are not offered in 'aws'" in bad.stderr
    assert issubclass(UnknownNameError, CmdareError)
