"""The planner's lifetimes per market: a 30-hour job on AWS Spot outlives GCE preemptible's 24 h deadline,
the outputs name each configuration's lifetime model, and a trace file drives ``plan simulate``."""

from __future__ import annotations

import json

import pytest
from plan_toys import run_cli

JOB = ["plan", "simulate", "--model", "t2t_resnet32", "--workers", "v100:4", "--ps", "1", "--transient", "--json"]
AWS = ["--cloud", "aws", "--region", "us-east-1"]
GCE = ["--cloud", "gcp", "--region", "us-east1"]


def _simulate(monkeypatch, capsys, *args) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, *JOB, *args)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def steps_30h():
    """Steps that take 30 h on 4 V100s without revocations (the speed models may be refitted, so measured)."""
    from cmdare.plan.adapters import load_plan_models
    from cmdare.plan.simulator import deterministic_time_s
    from cmdare.plan.spec import ClusterSpec, JobSpec, parse_workers

    models = load_plan_models("t2t_resnet32", "none", None, "aws")
    cluster = ClusterSpec(parse_workers("v100:4", True, "us-east-1"), ps=1, region="us-east-1")
    probe = 1_000_000
    return round(probe * 30 * 3600 / deterministic_time_s(JobSpec("t2t_resnet32", probe), cluster, models))


def test_30_hour_aws_spot_job_outlives_24h_but_gce_preemptible_does_not(monkeypatch, capsys, steps_30h):
    steps = ["--steps", str(steps_30h), "--runs", "400", "--seed", "3"]
    aws = _simulate(monkeypatch, capsys, *steps, *AWS, "--interruption-rate", ">20%")
    assert aws["deterministic_time_s"] == pytest.approx(30 * 3600, rel=0.01)
    assert aws["lifetime_models"] == {"v100": "exponential 25%/month (band >20%) (aws spot, assumption)"}
    assert aws["revocations_after_24h_mean"] > 0 and aws["server_age_max_h"] > 25  # no deadline
    gce = _simulate(monkeypatch, capsys, *steps, *GCE)
    assert gce["lifetime_models"] == {"v100": "bathtub:v100 (gcp preemptible)"}
    # GCE stops a preemptible VM by 24 h after its request (the fit's wall: up to 24.7 h from the insert request)
    assert gce["server_age_max_h"] < 24.75 and gce["revocations_mean"] >= 4  # every initial server dies
    # by default AWS V100 spot lifetimes come from the bundled p3 trace (issue 32), and the JSON says so
    default = _simulate(monkeypatch, capsys, *steps[:2], "--runs", "20", *AWS)
    assert default["lifetime_models"]["v100"] == "weibull fitted (aws:v100) (aws spot)"
    # 4 servers held 1.6 h on average over a 30 h job: about 4 x 30 / 1.6 = 74 revocations
    assert 50 < default["revocations_mean"] < 110


def test_pareto_table_and_json_name_the_lifetime_model(monkeypatch, capsys):
    args = ["plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline", "2h", "--gpus", "k80,t4",
            "--max-workers", "2", "--max-ps", "1", "--runs", "10", "--no-mixes"]
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0
    front = json.loads(out)["front"]
    assert front and all("lifetime_models" in o for o in front)
    labels = {v for o in front for v in o["lifetime_models"].values()}
    assert labels <= {"bathtub:k80 (gcp preemptible)", "exponential 12%/month (gcp spot, assumption)"}
    code, table, _ = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and "lifetime model" in table


@pytest.mark.parametrize(("args", "needle"), [
    (["--interruption-rate", "often"], "cannot read interruption rate"),
    (["--interruption-rate", "5%", "--lifetime", "bathtub"], "--lifetime auto"),
    (["--trace", "/nonexistent/t.csv"], "no such trace file"),
    (["--trace", "x.csv", "--revocations", "none"], "not both"),
])
def test_bad_market_input_is_one_line(monkeypatch, capsys, args, needle):
    code, _, err = run_cli(monkeypatch, capsys, *JOB, "--steps", "6400", "--runs", "2", *args)
    assert code == 1 and needle in err and len(err.strip().splitlines()) == 1


def test_trace_file_drives_plan_simulate(monkeypatch, capsys, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,server,event\n1800,*,revoke\n3000,0,notice\n3600,v100,revoke\n7200,*,available\n")
    data = _simulate(monkeypatch, capsys, "--steps", "640000", "--runs", "5", *GCE, "--trace", str(trace))
    assert data["revocations"] == f"trace={trace}" and data["revocations_mean"] == 2
    assert data["revocation_times_s"] == [1800.0, 3600.0]
    cbl = tmp_path / "us-east-1f_v100_1.json"
    cbl.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 0, 1, 0, 0, 1, 1, 0]}))
    data = _simulate(monkeypatch, capsys, "--steps", "640000", "--runs", "3", *AWS, "--revocations", f"trace={cbl}")
    assert data["revocation_times_s"] == [1200.0, 3000.0] and data["revocations_mean"] == 2
