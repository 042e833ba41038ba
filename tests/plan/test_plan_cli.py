"""``cmdare plan`` and ``cmdare plan simulate`` through the real CLI entry point."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from plan_toys import run_cli

from cmdare.errors import UserInputError
from cmdare.plan.options import parse_deadline_s

SIM = ["plan", "simulate", "--model", "t2t_resnet32", "--steps", "64000", "--runs", "20", "--seed", "1"]


def test_simulate_json_only(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "k80:8", "--ps", "1", "--transient", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["workers"] == {"k80": 8} and data["runs"] == 20
    assert 0 < data["time_s"]["p50"] <= data["time_s"]["p95"]
    assert data["time_s"]["mean"] >= data["deterministic_time_s"] * 0.999999
    assert data["cost_usd"]["mean"] > 0 and data["revocations_mean"] > 0  # transient K80s: some are revoked
    again = json.loads(run_cli(monkeypatch, capsys, *SIM, "--workers", "k80:8", "--transient", "--json")[1])
    assert again["time_s"] == data["time_s"]  # deterministic for a seed


def test_simulate_mix_table(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, *SIM, "--workers", "v100:1,p100:1,k80:2", "--ps", "2")
    assert code == 0 and "time" in out and "cost" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workers", "k80:0"], "at least 1"),
        (["--workers", "k80:4", "--ps", "9"], "ps must be between"),
        (["--workers", "h800:2"], "unknown GPU"),
        (["--workers", "k80:2", "--region", "mars-1"], "unknown gcp region"),
        (["--workers", "k80:2", "--replacement", "maybe"], "replacement policy"),
        (["--workers", "k80:2", "--lifetime", "weird"], "unknown lifetime model"),
        (["--workers", "k80:2", "--ps", "0"], "needs 1 worker"),
        (["--workers", "k80:2", "--runs", "0"], "at least 1"),
    ],
)
def test_simulate_bad_input_one_line(monkeypatch, capsys, args, needle):
    code, out, err = run_cli(monkeypatch, capsys, *SIM, *args)
    assert code == 1
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--deadline", "-1h"], "in the past"),
        (["--deadline", "2020-01-01T00:00"], "in the past"),
        (["--budget", "-5"], "negative"),
        (["--gpus", "k80,h900"], "unknown GPU"),
        (["--max-workers", "0"], "at least 1"),
    ],
)
def test_plan_bad_input_one_line(monkeypatch, capsys, args, needle):
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000", *args)
    assert code == 1 and needle in err and len(err.strip().splitlines()) == 1


def test_plan_recommends_and_plots(monkeypatch, capsys, tmp_path: Path):
    png = tmp_path / "pareto.png"
    code, out, _ = run_cli(
        monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline", "1h",
        "--gpus", "k80,p100", "--max-workers", "8", "--runs", "20", "--plot", str(png),
    )
    assert code == 0, out
    assert "Pareto front" in out and "cheapest meeting 1h 00m" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_unmeetable_deadline_names_the_fastest(monkeypatch, capsys):
    code, out, _ = run_cli(
        monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline", "10min",
        "--gpus", "k80", "--max-workers", "4", "--runs", "10", "--json",
    )
    data = json.loads(out)
    assert code == 0 and not data["constraint_met"]
    assert data["message"].startswith("no configuration meets 10 min; fastest is ")
    assert data["front"]


def test_parse_deadline():
    assert parse_deadline_s("2h") == 7200
    assert parse_deadline_s("1h30m") == 5400
    assert parse_deadline_s("90min") == 5400
    assert parse_deadline_s("600") == 600
    with pytest.raises(UserInputError):
        parse_deadline_s("soon")


def test_plan_without_model_says_what_is_missing(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "plan")
    assert code == 1 and "needs --model and --steps" in err


def test_plot_into_missing_folder_is_one_line(monkeypatch, capsys, tmp_path: Path):
    code, _, err = run_cli(
        monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "6400", "--gpus", "k80",
        "--max-workers", "2", "--runs", "5", "--plot", str(tmp_path / "no" / "p.png"),
    )
    assert code == 1 and "does not exist" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("cloud", ["aws", "AWS"])  # issue 42: any case
def test_simulate_on_aws_picks_an_aws_region_by_default(monkeypatch, capsys, cloud):
    """Issue 30: ``--cloud aws`` on its defaults said ``unknown aws region 'us-east1'``; issue 42: ``--cloud AWS``
    ended in ``ServerSpec.cloud must be one of gcp, aws, local``."""
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "v100:4", "--transient", "--cloud", cloud,
                             "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["cloud"] == "aws" and data["region"] == "us-east-1"


def test_plan_on_aws_considers_what_aws_offers_by_default(monkeypatch, capsys):
    """Issue 30: ``plan --cloud aws`` on its defaults failed on P100 (not on AWS), then on the spot price of a
    K80 (AWS sells K80s on demand only)."""
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline",
                             "2h", "--cloud", "aws", "--runs", "5", "--max-workers", "4", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "us-east-1" in json.dumps(data["choice"]) and "p100" not in out.lower()


def test_simulate_reads_a_bare_count_as_the_default_gpu_and_names_it(monkeypatch, capsys):
    """Issue 42: ``--workers 4`` said ``unknown GPU '4' (did you mean 't4'?)``; a count means that many workers of
    the default GPU (T4) in every command, and the output names it."""
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "4", "--transient", "--json")
    assert code == 0 and err == "", err
    data = json.loads(out)
    assert data["workers"] == {"t4": 4} and data["config"].startswith("4xT4 spot")
    assert any("4 x T4 (the default GPU of gcp;" in note for note in data["notes"])
    named = json.loads(run_cli(monkeypatch, capsys, *SIM, "--workers", "t4:4", "--transient", "--json")[1])
    assert named["time_s"] == data["time_s"] and named["notes"] == []
    code, out, _ = run_cli(monkeypatch, capsys, *SIM, "--workers", "2", "--cloud", "aws")
    assert code == 0 and "2xT4 on-demand" in out and "note: --workers 2: 2 x T4 (the default GPU of aws;" in out


def test_plan_reads_the_cloud_in_any_case(monkeypatch, capsys):
    """Issue 42: ``--cloud AWS`` ended in ``ServerSpec.cloud must be one of gcp, aws, local``."""
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000",
                             "--cloud", " Aws", "--max-workers", "2", "--runs", "3", "--json")
    assert code == 0 and "us-east-1" in json.dumps(json.loads(out)["choice"]), err
    code, _, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "v100:2", "--cloud", "Azure")
    assert code == 1 and "unknown cloud 'azure'" in err and "gcp" in err and len(err.strip().splitlines()) == 1


def test_retired_k80s_are_flagged_and_left_out_of_recommendations_unless_asked(monkeypatch, capsys):
    """Issue 42: plan tables offered K80s, which the clouds retired and current PyTorch cannot use, with no word."""
    plan = ["plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline", "2h", "--max-workers", "2",
            "--runs", "3"]
    code, out, err = run_cli(monkeypatch, capsys, *plan, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["left_out_retired_gpus"] == ["k80"] and data["retired_gpus"] == []
    assert "K80" not in json.dumps(data["front"]) and "left out of this plan" in data["notes"][0]
    asked = json.loads(run_cli(monkeypatch, capsys, *plan, "--include-retired", "--json")[1])
    assert asked["left_out_retired_gpus"] == [] and asked["retired_gpus"] == ["k80"]
    code, out, _ = run_cli(monkeypatch, capsys, *plan, "--gpus", "k80", "--topologies", "ps")  # named: flagged
    assert code == 0 and "1xK80 spot + no PS @us-east1 (retired: K80)" in out
    assert "note: K80 retired: gcp no longer rents it and current PyTorch CUDA builds do not run on compute " \
           "capability 3.7" in out
    code, out, _ = run_cli(monkeypatch, capsys, *SIM, "--workers", "k80:8", "--transient")
    assert code == 0 and "8xK80 spot + 1 PS @us-east1 (retired: K80)" in " ".join(out.split())  # the title wraps
    assert "note: K80 retired" in out
    data = json.loads(run_cli(monkeypatch, capsys, *SIM, "--workers", "k80:8", "--transient", "--json")[1])
    assert data["retired_gpus"] == ["k80"] and "K80 retired" in data["notes"][0]


def test_the_readme_plan_simulate_example_runs_on_both_clouds(monkeypatch, capsys):
    """Issue 42: the README's example failed with the ``--cloud aws`` it suggests (``no spot/preemptible price for
    K80 servers in aws``): AWS rents K80s on demand only, so the example uses a GPU both clouds rent as spot."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    found = re.search(r"`cmdare (plan simulate [^`\[]*?) \[--cloud aws\]", readme)
    assert found, "the README no longer shows plan simulate ... [--cloud aws]"
    args = [*found.group(1).split(), "--runs", "5"]
    for cloud in ("gcp", "aws"):
        code, out, err = run_cli(monkeypatch, capsys, *args, "--cloud", cloud)
        assert code == 0, err
        assert json.loads(out)["cloud"] == cloud


def test_a_spot_gpu_a_cloud_does_not_rent_is_one_line_saying_what_it_does(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "k80:8", "--transient", "--cloud", "aws")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "rents no K80 (retired) as spot/preemptible servers: drop --transient, or choose another GPU type" in err
    assert "k80" not in err.split("GPU type")[1]  # the other types offered, retired ones left out


def test_the_deadline_hint_gives_a_date_to_come():
    """Issue 42: the hint's example date (2026-11-29T18:00) was in the past."""
    with pytest.raises(UserInputError, match="2031-01-01T18:00") as err:
        parse_deadline_s("soon", now=datetime(2030, 12, 31, 23, 30))
    example = re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", str(err.value)).group(0)
    assert parse_deadline_s(example, now=datetime(2030, 12, 31, 23, 30)) > 0
    with pytest.raises(UserInputError) as err:
        parse_deadline_s("soon")
    assert parse_deadline_s(re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", str(err.value)).group(0)) > 0


def test_the_planner_doc_validates_with_the_network_the_test_does():
    """Issue 42: docs/planner.md validated with ``--model resnet32`` and called it T2T's ResNet-32 (that is
    ``t2t_resnet32``; ``resnet32`` is cmdare's zoo network, predicted from its profile)."""
    doc = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text("utf-8"))
    section = doc[doc.index("## Validation against the published runs"):]
    model, batch = re.search(r"`cmdare plan simulate --model (\S+) --steps 64000 --batch-size (\d+) ", section).groups()
    validation = (Path(__file__).parent / "test_plan_validation.py").read_text("utf-8")
    assert model == "t2t_resnet32" and f'JobSpec("{model}", 64000, batch_size={batch})' in validation
    assert batch == "128"  # ICAC 2019 trained at Tensor2Tensor's batch
    assert not re.search(r"`resnet32` = CM-DARE's Tensor2Tensor", doc)


def test_the_python_api_reads_the_cloud_in_any_case():
    """``load_plan_models(cloud="AWS")`` is AWS: its prices, its spot markets and its 120 s notice (GCE's 30 s
    before), and a simulation of it runs (it ended in ``ServerSpec.cloud must be one of ...``)."""
    from cmdare.plan import simulate
    from cmdare.plan.adapters import load_plan_models
    from cmdare.plan.spec import ClusterSpec, JobSpec, parse_workers

    models = load_plan_models("t2t_resnet32", cloud="AWS")
    assert models.notice_s == 120.0 and models.prices.cloud == "aws"
    cluster = ClusterSpec(parse_workers("v100:2", True, "us-east-1"), ps=1, region="us-east-1")
    assert simulate(JobSpec("t2t_resnet32", 6400), cluster, models, runs=3, seed=0).cost_mean_usd > 0


def test_plan_says_what_the_step_times_of_gpus_outside_cmdares_table_rest_on(monkeypatch, capsys):
    """Issue 45: a prediction for a GPU CM-DARE's K80/P100 table lacks names the cross-generation model and what
    it extrapolates from, in the plan's models line."""
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "a100:2,k80:1", "--json")
    assert code == 0, err
    models = json.loads(out)["models"]
    assert "step times of A100: the cross-generation model (A100 from its spec sheet at Volta's efficiencies)" in models
    assert "K80" not in models.split("step times of")[1]
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "k80:2", "--json")
    assert "step times of" not in json.loads(out)["models"]


def test_plan_predicts_at_the_runs_precision_and_leaves_out_gpus_without_its_arithmetic(monkeypatch, capsys):
    """Issue 45 item 4: --precision is priced by the cross-generation model; a GPU type without the arithmetic is
    left out with a note (plan) or refused in one line (plan simulate)."""
    base = ["plan", "--model", "resnet50", "--input-shape", "3,224,224", "--batch-size", "64", "--steps", "20000",
            "--deadline", "1h", "--gpus", "a100,l4,t4", "--runs", "5", "--max-workers", "4"]
    code, out, err = run_cli(monkeypatch, capsys, *base, "--precision", "amp-bf16")
    assert code == 0, err
    assert "note: T4 left out: no bf16 arithmetic for --precision amp-bf16" in out
    assert "--precision amp-bf16" in out and "(speed at amp-bf16)" in out
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "a100:1", "--json")
    fp32 = json.loads(out)["time_s"]["mean"]
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "a100:1", "--precision", "amp-bf16", "--json")
    assert code == 0 and json.loads(out)["time_s"]["mean"] < fp32
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--workers", "v100:1", "--precision", "amp-bf16")
    assert code == 1 and "V100 (Volta) has no bf16 arithmetic" in err
    for args in (base, [*SIM, "--workers", "a100:1"]):  # an unknown precision: one line, before any simulation
        code, out, err = run_cli(monkeypatch, capsys, *args, "--precision", "fp8")
        assert code == 1 and "unknown --precision 'fp8'; valid: fp32, amp-bf16, amp-fp16" in err
        assert "Traceback" not in err
    code, out, err = run_cli(monkeypatch, capsys, *base[:-6], "--gpus", "t4,v100", "--precision", "amp-bf16")
    assert code == 1 and "none of T4, V100 has the arithmetic for it" in err
