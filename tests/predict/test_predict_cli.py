"""`cmdare predict ...` and `cmdare models ...` through the real CLI entry point."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from cmdare import cli
from cmdare.predict.data import load_cluster_speed, load_single_gpu_speed

CMDARE = [sys.executable, "-c", "from cmdare.cli import main; main()"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    return {**os.environ, "CMDARE_HOME": str(home)}


def run(env, *args: str) -> Result:
    """In-process run of the real entry point ``cmdare.cli.main``: its exit status (``sys.exit``'s) and
    what it printed. An exception main() does not turn into an ``error:`` line propagates (fails the test)."""
    old_home, old_argv = os.environ.get("CMDARE_HOME"), sys.argv
    os.environ["CMDARE_HOME"] = env["CMDARE_HOME"]
    sys.argv = ["cmdare", *args]
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old_argv
        if old_home is None:
            os.environ.pop("CMDARE_HOME")
        else:
            os.environ["CMDARE_HOME"] = old_home
    return Result(code, out.getvalue(), err.getvalue())


def run_subprocess(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CMDARE, *args], env=env, capture_output=True, text=True, timeout=300)


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_batch_size_and_the_gpus_a_prediction_extrapolates_to(env):
    """Issue 45: the step time follows --batch-size (default: train's 32), bad ones and tables refuse it in one
    line; a GPU type the step-time data did not measure gets a note naming what its prediction rests on."""
    at = {b: run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "k80", "--batch-size", str(b))
          for b in (16, 32, 128)}
    default = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "k80")
    times = {b: float(r.stdout.split()[0]) for b, r in at.items()}
    assert times[16] < times[32] < times[128] and default.stdout == at[32].stdout
    assert "note:" not in at[32].stderr  # K80 was measured
    for bad in ("0", "-3"):
        out = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "k80", "--batch-size", bad)
        assert out.returncode == 1 and "batch size must be a positive whole number" in out.stderr
    out = run(env, "predict", "step-time", "--input", "x.csv", "--batch-size", "64")
    assert out.returncode == 1 and "--batch-size does not apply to an --input table" in out.stderr
    a100 = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "a100")
    assert a100.returncode == 0 and "note: A100 was not measured in the step-time data (K80, P100 were)" in a100.stderr
    assert "19.5 TFLOPS FP32, 1555 GB/s" in a100.stderr and "this extrapolates" in a100.stderr
    mix = run(env, "predict", "cluster-speed", "--model", "t2t_resnet32", "--workers", "k80:1,h100:1")
    assert mix.returncode == 0 and mix.stderr.count("was not measured in the step-time data") == 1
    assert "note: H100 was not measured" in mix.stderr


def test_single_questions(env):
    out = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "k80", "--batch-size", "128")
    assert out.returncode == 0, out.stderr
    assert 0.19 < float(out.stdout.split()[0]) < 0.24  # measured at 128: 0.218 s
    out = run(env, "predict", "cluster-speed", "--model", "t2t_resnet15", "--workers", "k80:2,p100:2", "--ps", "2")
    assert out.returncode == 0 and float(out.stdout.split()[0]) > 40
    out = run(env, "predict", "checkpoint", "--size-mb", "16", "--tensors", "104", "--remote")
    assert out.returncode == 0 and 3.0 < float(out.stdout.split()[0]) < 4.5
    out = run(env, "predict", "startup", "--gpu", "p100", "--transient", "--samples", "50")
    assert out.returncode == 0 and "Staging=" in out.stdout and "p95=" in out.stdout


def test_cluster_speed_reads_a_bare_count_as_every_command_does(env):
    """Issue 42: ``--workers 4`` said ``unknown GPU type '4' (did you mean 'T4'?)``, and following the hint
    predicted one T4. A count means that many of the default GPU (T4), named on stderr."""
    count = run(env, "predict", "cluster-speed", "--model", "t2t_resnet32", "--workers", "4", "--ps", "1")
    assert count.returncode == 0, count.stderr
    assert "note: --workers 4: 4 x T4 (the default GPU;" in count.stderr
    named = run(env, "predict", "cluster-speed", "--model", "t2t_resnet32", "--workers", "t4:4", "--ps", "1")
    assert named.returncode == 0 and named.stdout == count.stdout and "default GPU" not in named.stderr
    one = run(env, "predict", "cluster-speed", "--model", "t2t_resnet32", "--workers", "t4", "--ps", "1")
    assert float(one.stdout.split()[0]) < float(count.stdout.split()[0])  # a bare name is one of it
    for workers, needle in (("0", "at least 1"), ("2.5", "whole number"), ("t4:0", "at least 1 worker of t4")):
        bad = run(env, "predict", "cluster-speed", "--model", "t2t_resnet32", "--workers", workers)
        assert bad.returncode == 1 and needle in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_step_time_table_keeps_rows_and_extra_columns(env, tmp_path):
    df = load_single_gpu_speed()
    sub = df.groupby(["gpu", "cnn"]).first().reset_index()
    cols = ["GPU TFLOPS", "Model FLOPs", "Number of Parameters", "Average Tensor Size (MB)", "Latency (ms)"]
    table = sub[["cnn", *cols]].rename(columns={"cnn": "key"})
    table["Average Tensor Size (MB)"] = sub["Number of Parameters"] * 4 / sub["Number of Tensors"] / 2**20
    inp, outp = tmp_path / "in.csv", tmp_path / "out.csv"
    table.to_csv(inp, index=False)
    res = run(env, "predict", "step-time", "--input", str(inp), "--output", str(outp))
    assert res.returncode == 0, res.stderr
    out = pd.read_csv(outp)
    assert list(out.columns) == [*table.columns, "Predicted Step Time (s)"]
    assert (out["key"] == table["key"]).all()
    measured = df.groupby(["gpu", "cnn"])["Step Time (s)"].mean().to_numpy()
    ape = (out["Predicted Step Time (s)"] - measured).abs() / measured
    assert ape.mean() < 0.05  # in-sample (the models are fitted on this data)


def test_cluster_table_with_gpus_or_tflops(env, tmp_path):
    c = load_cluster_speed()
    rows = c[c["Workers"].isin([1, 4, 8])]
    header = ["key", "GPU TFLOPS", "Workers", "PS", "Model FLOPs", "Number of Parameters", "Number of Tensors"]
    data = [
        [
            f"{r.cnn}-{r.gpu}-{r.Workers}",
            r["GPU TFLOPS"],
            r.Workers,
            1,
            r["Model FLOPs"],
            r["Number of Parameters"],
            r["Number of Tensors"],
        ]
        for _, r in rows.iterrows()
    ]
    inp = write_csv(tmp_path / "c.csv", header, data)
    res = run(env, "predict", "cluster-speed", "--input", str(inp), "--output", str(tmp_path / "o.csv"))
    assert res.returncode == 0, res.stderr
    out = pd.read_csv(tmp_path / "o.csv")
    ape = (out["Predicted Speed (steps/sec)"] - rows["Speed (steps/sec)"].to_numpy()).abs() / rows[
        "Speed (steps/sec)"
    ].to_numpy()
    assert len(out) == len(rows) and ape.mean() < 0.08
    mixed = write_csv(
        tmp_path / "m.csv",
        ["GPUs", "PS", "Model FLOPs", "Number of Parameters"],
        [["k80:2,p100:1", 1, 1658696889, 1857722], ["v100:4", 2, 630989589, 693818]],
    )
    res = run(env, "predict", "cluster-speed", "--input", str(mixed))
    assert res.returncode == 0, res.stderr
    assert "Predicted Speed (steps/sec)" in res.stdout.splitlines()[0]


@pytest.mark.parametrize(
    ("kind", "header", "row", "message"),
    [
        ("step-time", ["GPU TFLOPS", "Model FLOPs"], [4.1, 1e9], "missing column"),
        (
            "step-time",
            ["GPU TFLOPS", "Model FLOPs", "Number of Parameters"],
            [4.1, "lots", 1e6],
            "row 2, column 'Model FLOPs'",
        ),
        (
            "step-time",
            ["GPU TFLOPS", "Model FLOPs", "Number of Parameters"],
            [4.1, 1e9, -5],
            "row 2, column 'Number of Parameters'",
        ),
        (
            "step-time",
            ["GPU TFLOPS", "Model FLOPs", "Number of Parameters"],
            [4.1, "", 1e6],
            "row 2, column 'Model FLOPs'",
        ),
        (
            "cluster-speed",
            ["GPUs", "PS", "Model FLOPs", "Number of Parameters"],
            ["x100:2", 1, 1e9, 1e6],
            "row 2, column 'GPUs'",
        ),
        (
            "cluster-speed",
            ["GPUs", "PS", "Model FLOPs", "Number of Parameters"],
            ["k80:2", 0, 1e9, 1e6],
            "row 2, column 'PS'",
        ),
        ("checkpoint", ["Checkpoint Size (MB)"], ["nan"], "row 2, column 'Checkpoint Size (MB)'"),
    ],
)
def test_bad_input_is_one_line_error(env, tmp_path, kind, header, row, message):
    good = {
        "step-time": [4.113, 630989589, 693818],
        "cluster-speed": ["k80:1", 1, 630989589, 693818],
        "checkpoint": [6.27],
    }[kind]
    good = good[: len(header)] + [1] * (len(header) - len(good))
    inp = write_csv(tmp_path / "bad.csv", header, [good, row])
    res = run(env, "predict", kind, "--input", str(inp))
    assert res.returncode == 1
    assert res.stderr.startswith("error:") and message in " ".join(res.stderr.split())


def test_bad_input_through_the_real_entry_point_is_one_line(env, tmp_path):
    inp = write_csv(
        tmp_path / "bad.csv",
        ["GPU TFLOPS", "Model FLOPs", "Number of Parameters"],
        [[4.113, 630989589, 693818], [4.113, "n/a", 693818]],
    )
    res = run_subprocess(env, "predict", "step-time", "--input", str(inp))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert "row 2, column 'Model FLOPs'" in " ".join(res.stderr.split())
    assert len(res.stderr.strip().splitlines()) <= 2  # one message (rich may wrap it)


def test_missing_input_and_unknown_names(env, tmp_path):
    res = run(env, "predict", "step-time", "--input", str(tmp_path / "none.csv"))
    assert res.returncode == 1 and res.stderr.startswith("error:") and "does not exist" in res.stderr
    res = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "x100")
    assert res.returncode == 1 and res.stderr.startswith("error:") and "x100" in res.stderr
    res = run(env, "predict", "cluster-speed", "--model", "nope", "--workers", "k80:1")
    assert res.returncode == 1 and res.stderr.startswith("error:") and "Res32" in res.stderr


def test_models_evaluate_prints_baselines_and_writes_plots(env, tmp_path):
    res = run(env, "models", "evaluate", "--task", "checkpoint_remote", "--plot-dir", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "published SVR on size" in res.stdout and "cmdare CheckpointModel" in res.stdout
    assert "loco" in res.stdout and "random" in res.stdout
    assert (tmp_path / "models_checkpoint_remote.png").stat().st_size > 10_000
    res = run(env, "models", "evaluate", "--task", "startup")
    assert res.returncode == 0 and "group held out: mean APE" in res.stdout
    res = run(env, "models", "evaluate", "--task", "nope")
    assert res.returncode == 1 and "step_time" in res.stderr and "generations" in res.stderr


def test_models_evaluate_generations_prints_the_cross_generation_checks(env):
    res = run(env, "models", "evaluate", "--task", "generations")
    assert res.returncode == 0, res.stderr
    assert "leave-one-GPU-out" in res.stdout and "leave-one-family-out" in res.stdout
    assert "CM-DARE networks on V100, held out: MAPE 7.4" in res.stdout
    assert "P100 with 2 PS, fitted on 1 PS" in res.stdout
    res = run(env, "models", "evaluate", "--task", "generations", "--json")
    rows = json.loads(res.stdout)
    assert {r["check"] for r in rows} == {"errors", "held_out_v100", "two_ps"}


def test_predict_step_time_takes_precision_and_names_what_an_unmeasured_gpu_rests_on(env):
    base = ["predict", "step-time", "--model", "resnet50", "--input-shape", "3,224,224", "--batch-size", "64"]
    fp32 = run(env, *base, "--gpu", "a100")
    bf16 = run(env, *base, "--gpu", "a100", "--precision", "amp-bf16")
    assert fp32.returncode == 0 and bf16.returncode == 0, fp32.stderr + bf16.stderr
    assert float(bf16.stdout.split()[0]) < float(fp32.stdout.split()[0])
    assert "TF32 156 TFLOPS for convolutions" in fp32.stderr and "efficiencies fitted on Volta" in fp32.stderr
    bad = run(env, *base, "--gpu", "v100", "--precision", "amp-bf16")
    assert bad.returncode != 0 and "needs Ampere or newer" in bad.stderr
    # cluster speed: one worker (no PS queue to hide behind) gains; a K80 in the mix is refused in one line
    one = ["predict", "cluster-speed", *base[2:], "--workers", "a100:1"]
    fp32_speed, bf16_speed = run(env, *one), run(env, *one, "--precision", "amp-bf16")
    assert float(bf16_speed.stdout.split()[0]) > float(fp32_speed.stdout.split()[0])
    mixed = run(env, *one[:-1], "k80:1,a100:1", "--precision", "amp-bf16")
    assert mixed.returncode == 1 and "K80 (Kepler) has no bf16" in mixed.stderr
    # bad input: one line each, no traceback
    for cmd in (base + ["--gpu", "a100"], one):
        bad = run(env, *cmd, "--precision", "fp8")
        assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
            "error: unknown --precision 'fp8'; valid: fp32, amp-bf16, amp-fp16")
    by_tflops = run(env, *base, "--gpu", "19.5", "--precision", "amp-bf16")
    assert by_tflops.returncode == 1 and "needs a GPU type by name" in by_tflops.stderr


def test_a_gpu_given_by_its_tflops_is_named_as_the_catalog_gpu_the_model_prices_it_as(env):
    res = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "19.5")
    named = run(env, "predict", "step-time", "--model", "t2t_resnet32", "--gpu", "a100")
    assert res.returncode == 0 and res.stdout == named.stdout
    assert "note: a 19.5-TFLOPS GPU (the catalog's A100) was not measured" in res.stderr
    assert "by the cross-generation model, Ampere at the efficiencies fitted on Volta" in res.stderr
