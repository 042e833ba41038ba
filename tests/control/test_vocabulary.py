"""One vocabulary for both command lines: ``cmdare train`` and ``cmdare plan simulate`` name replacement
policies, LR policies and revocation sources alike, from the control kernel's registries."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cmdare.cli import app
from cmdare.control import LR_POLICIES, REPLACEMENT_POLICIES

runner = CliRunner()


@pytest.mark.parametrize("command", [["train"], ["plan", "simulate"]])
def test_both_commands_take_the_same_options_and_names(command):
    text = " ".join(runner.invoke(app, [*command, "--help"], env={"COLUMNS": "300"}).output.split())
    for option in ("--replacement", "--replace", "--revocations", "--lr-policy"):
        assert option in text, option
    assert " | ".join(REPLACEMENT_POLICIES.names()) in text
    assert " | ".join(LR_POLICIES.names()) in text
    assert "every=S[,first=F]" in text and "trace=T@SLOT+..." in text


def test_plan_simulate_takes_the_trainers_revocation_specs(tmp_path):
    base = ["plan", "simulate", "--model", "t2t_resnet32", "--steps", "20000", "--workers", "k80:2", "--transient",
            "--runs", "5", "--seed", "1", "--json"]
    env = {"CMDARE_HOME": str(tmp_path)}
    periodic = runner.invoke(app, [*base, "--replace", "same", "--revocations", "every=600,first=300",
                                   "--lr-policy", "linear"], env=env)
    doc = json.loads(periodic.stdout)
    assert doc["revocations"] == "every=600,first=300" and doc["lr_policy"] == "linear"
    # a revocation every 10 min (the first at 5 min): as many as fit in the run, each replaced
    assert doc["revocations_mean"] == pytest.approx((doc["time_s"]["mean"] - 300) // 600 + 1, abs=1)
    assert doc["replacements_mean"] == doc["revocations_mean"]
    none = json.loads(runner.invoke(app, [*base, "--revocations", "none"], env=env).stdout)
    assert none["revocations_mean"] == 0 and none["time_s"]["mean"] == none["deterministic_time_s"]
    bad = runner.invoke(app, [*base, "--revocations", "lifetime=bathtub,speedup=60"], env=env)
    assert bad.exit_code != 0 and "speedup" in str(bad.exception)
