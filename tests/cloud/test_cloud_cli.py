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
from cmdare.plan.catalog_command import catalog_command

CMDARE = Path(sys.executable).parent / "cmdare"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    register(app)
    app.command("catalog")(catalog_command)
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
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--ps", "-1"], UserInputError, "--ps must be >= 0"),
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--region", "asia-x9"], UnknownNameError, "asia-x9"),
        (["cluster-config", "--cloud", "oracle", "--gpu", "k80"], UnknownNameError, "oracle"),
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--storage", "/mnt/ckpt"], UserInputError, "local path"),
        (["cluster-config", "--cloud", "aws", "--workers", "t4:x"], UserInputError, "--workers: bad GPU count"),
        (["cluster-config", "--cloud", "aws", "--workers", "t4:1,b200:2"], UnknownNameError, "GPU type 'b200'"),
        (["cluster-config", "--cloud", "aws", "--workers", "2.5"], UserInputError, "whole number or a mix"),
        (["cluster-config", "--cloud", "aws", "--workers", "t4:2,v100:0"], UserInputError, "at least 1 worker of v100"),
        (["cluster-config", "--cloud", "aws", "--gpu", "t4", "--wheel", "/nowhere/cmdare-0.1.0-py3-none-any.whl"],
         UserInputError, "no such file"),
        (["cluster-config", "--cloud", "aws", "--gpu", "t4", "--cmdare-spec", "cmdare"], UserInputError,
         "not published"),
        (["cluster-config", "--cloud", "local", "--workers", "k80:2", "--zone", "x"], UserInputError,
         "only for a cloud"),
        (["cluster-config", "--cloud", "gcp", "--gpu", "k80", "--spare-nodes", "2"], UserInputError,
         "only for --cloud local"),
    ],
)
def test_bad_input_raises_cmdare_errors(app, args, error, needle):
    out = _run(app, *args)  # CliRunner gives exit code 1 for any exception: the exception is what counts
    assert isinstance(out.exception, error), out.output
    assert needle in str(out.exception) and "\n" not in str(out.exception)


def _wheel(tmp_path: Path) -> Path:
    path = tmp_path / "dist" / "cmdare-0.1.0-py3-none-any.whl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"not really a wheel")
    return path


def test_cluster_config_to_file_and_stdout(app, tmp_path):
    wheel = _wheel(tmp_path)
    target = tmp_path / "cluster.yaml"
    out = _run(app, "cluster-config", "--cloud", "gcp", "--gpu", "k80", "--workers", "4", "--ps", "1",
               "--transient", "--storage", "gs://bucket/ckpt", "--wheel", str(wheel), "--output", str(target))
    assert out.exit_code == 0, out.output
    config = yaml.safe_load(target.read_text())
    worker = config["available_node_types"]["cmdare_worker_k80"]
    assert worker["node_config"]["scheduling"]["preemptible"] is True
    assert config["file_mounts"]["~/cmdare-wheels/cmdare-0.1.0-py3-none-any.whl"] == str(wheel.resolve())
    assert "export CMDARE_STORAGE=gs://bucket/ckpt;" in config["worker_start_ray_commands"][1]
    assert "warning: K80 (compute capability 3.7)" in out.stderr and "sm_37" in out.stderr  # and not in the YAML's body
    assert f"wrote {target}" in out.stderr and "0.0.0.0" not in target.read_text()
    out = _run(app, "cluster-config", "--cloud", "aws", "--workers", "v100:2,t4:1", "--ps", "1", "--transient",
               "--storage", "s3://bucket/ckpt", "--cmdare-spec", "git+https://example.org/cmdare.git@v0.1.0")
    assert out.exit_code == 0, out.output
    assert "MarketType: spot" in out.stdout and "cmdare_worker_v100" in out.stdout and "cmdare_worker_t4" in out.stdout
    config = yaml.safe_load(out.stdout)
    assert "pip install -U 'cmdare[s3] @ git+https://example.org/cmdare.git@v0.1.0'" in config["setup_commands"]
    out = _run(app, "cluster-config", "--cloud", "gcp", "--gpu", "t4", "--wheel", str(wheel),
               "--output", str(tmp_path / "no" / "x.yaml"))
    assert isinstance(out.exception, UserInputError)


def test_a_bare_count_of_workers_is_the_default_gpu_named_on_stderr(app, tmp_path, monkeypatch):
    """Issue 42: ``--cloud gcp`` without ``--workers`` said ``--workers 4 needs --gpu TYPE`` though no 4 was typed;
    ``--workers 4`` means what it means in every command: 4 workers of the default GPU (T4), named."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path / "home"))
    out = _run(app, "cluster-config", "--cloud", "gcp")
    assert out.exit_code == 0, out.output
    assert "needs --gpu" not in out.output
    assert "note: --workers 4 (the default): 4 x T4 (the default GPU of gcp;" in out.stderr
    assert yaml.safe_load(out.stdout)["available_node_types"]["cmdare_worker_t4"]["min_workers"] == 4
    out = _run(app, "cluster-config", "--cloud", "AWS", "--workers", "3")
    assert out.exit_code == 0, out.output
    assert "note: --workers 3: 3 x T4 (the default GPU of aws;" in out.stderr
    assert "cmdare_worker_t4" in yaml.safe_load(out.stdout)["available_node_types"]
    for args in (["--gpu", "v100", "--workers", "3"], ["--workers", "v100:3"]):  # a named type: no note
        out = _run(app, "cluster-config", "--cloud", "aws", *args)
        assert out.exit_code == 0 and "default GPU" not in out.stderr, out.output
        assert "cmdare_worker_v100" in yaml.safe_load(out.stdout)["available_node_types"]


def test_cluster_config_finds_the_wheel_in_dist_or_packs_the_running_cmdare(app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path / "home"))
    out = _run(app, "cluster-config", "--cloud", "gcp", "--gpu", "t4")
    assert out.exit_code == 0 and "packed into" in out.stderr, out.output
    packed = tmp_path / "home" / "wheels" / "cmdare-0.1.0-py3-none-any.whl"
    assert str(packed.resolve()) in yaml.safe_load(out.stdout)["file_mounts"].values()
    wheel = _wheel(tmp_path)
    out = _run(app, "cluster-config", "--cloud", "gcp", "--gpu", "t4")
    assert out.exit_code == 0, out.output
    assert "warning: installing" in out.stderr and "dist/cmdare-0.1.0-py3-none-any.whl" in out.stderr
    assert str(wheel.resolve()) in yaml.safe_load(out.stdout)["file_mounts"].values()


def test_cluster_config_local(app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no wheel needed: the local cluster runs this machine's cmdare
    target = tmp_path / "local.yaml"
    out = _run(app, "cluster-config", "--cloud", "local", "--workers", "k80:2,t4:1", "--transient",
               "--storage", "ckpt", "--cpus-per-node", "2", "--spare-nodes", "2", "--output", str(target))
    assert out.exit_code == 0, out.output
    config = yaml.safe_load(target.read_text())
    assert config["provider"]["module"] == "cmdare.cloud.local_node_provider.LocalNodeProvider"
    assert config["head_node_type"] == "ray.head.default"
    k80 = config["available_node_types"]["cmdare_worker_k80"]
    assert (k80["min_workers"], k80["max_workers"], k80["resources"]["CPU"]) == (2, 4, 2)
    start = config["head_start_ray_commands"][0]
    assert f"--autoscaling-config={target}" in start and f"CMDARE_STORAGE={Path.cwd() / 'ckpt'}" in start
    assert "#   " + start in target.read_text().splitlines()  # the header says how to start it


@pytest.mark.skipif(not CMDARE.exists(), reason="cmdare entry point not installed next to this Python")
def test_real_entry_point_prints_one_line_errors_and_the_contract_output(tmp_path):
    cases = [(["--cloud", "aws", "--gpu", "p100", "--workers", "4", "--transient"],
              "P100 servers are not offered in 'aws'"),
             (["--cloud", "gcp", "--gpu", "t4", "--storage", "/mnt/ckpt"], "local path is not reachable"),
             (["--cloud", "gcp", "--workers", "k80:two"], "--workers: bad GPU count"),
             (["--cloud", "gcp", "--gpu", "t4", "--wheel", str(tmp_path / "cmdare-0.1.0-py3-none-any.whl")],
              "no such file")]
    for args, needle in cases:
        bad = subprocess.run([str(CMDARE), "cluster-config", *args], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], bad.stderr
    assert issubclass(UnknownNameError, CmdareError)
