"""Spot lifetimes fitted from preemption traces (issue 32): the shipped fits, a user's own fit through
`cmdare models fit lifetimes`, and the catalog, the planner and emulation using them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_spot_traces import BAD

from cmdare.cloud.catalog import load_catalog
from cmdare.errors import UserInputError
from cmdare.measure.lifetime_markets import market_lifetime
from cmdare.measure.spot_fits import SHIPPED_FITS, fit_bundled, fitted_spot_lifetime, parse_offering

CMDARE = str(Path(sys.executable).parent / "cmdare")
JOB = ["plan", "simulate", "--model", "t2t_resnet32", "--steps", "1000000", "--workers", "v100:4", "--ps", "1",
       "--transient", "--cloud", "aws", "--region", "us-east-1", "--runs", "20", "--json"]


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CMDARE_HOME=str(home), COLUMNS="200")
    return subprocess.run([CMDARE, *args], capture_output=True, text=True, env=env, timeout=180)


def test_the_shipped_fits_are_what_the_bundled_traces_give():
    shipped = json.loads(SHIPPED_FITS.read_text())
    fresh = fit_bundled(shipped["aws:v100"]["fitted_on"])
    assert set(shipped) == set(fresh) == {"aws:v100", "aws:t4", "gcp:a100:us-east1", "gcp:v100:us-east1"}
    for key, fit in fresh.items():
        assert shipped[key]["chosen"] == fit["chosen"], key
        assert shipped[key]["capacity"] == fit["capacity"], key  # the gaps until the count recovered
        for name, value in fit["model"]["params"].items():
            assert shipped[key]["model"]["params"][name] == pytest.approx(value, rel=1e-6), (key, name)


def test_offerings_without_a_trace_keep_the_catalogs_assumption():
    assert fitted_spot_lifetime("aws", "l4", "us-east-1") is None
    assert fitted_spot_lifetime("gcp", "a100", "europe-west4").key == "gcp:a100:us-east1"  # any region of it
    with pytest.raises(UserInputError, match="CLOUD:GPU"):
        parse_offering("azure:v100")


def _short_lived_trace(path: Path, mean_s: float = 1800.0, servers: int = 60) -> Path:
    """A Bamboo-format events trace: servers added at 0 and removed after exponential lifetimes; 6 h long."""
    ends = np.random.default_rng(1).exponential(mean_s, servers)
    events = [(0.0, "add", f"node{i}") for i in range(servers)]
    events += [(t, "remove", f"node{i}") for i, t in enumerate(ends) if t < 6 * 3600]
    events.append((6 * 3600.0, "add", "late"))
    path.write_text("".join(f"{int(t * 1000)},{kind},{name}\n" for t, kind, name in sorted(events)))
    return path


@pytest.mark.timeout(300)
def test_a_users_trace_replaces_the_default_with_one_command(tmp_path):
    before = json.loads(_cli(tmp_path, *JOB).stdout)
    trace = _short_lived_trace(tmp_path / "mine.csv")
    fit = _cli(tmp_path, "models", "fit", "lifetimes", "--trace", str(trace), "--offering", "aws:v100:us-east-1")
    assert fit.returncode == 0, fit.stderr
    assert "aws:v100:us-east-1: 61 servers" in fit.stdout and "saved to" in fit.stdout
    saved = tmp_path / "models" / "spot_lifetimes" / "aws_v100_us-east-1.json"
    assert json.loads(saved.read_text())["traces"] == [str(trace)]
    after = json.loads(_cli(tmp_path, *JOB).stdout)
    assert before["lifetime_models"]["v100"] == "weibull fitted (aws:v100) (aws spot)"
    assert after["lifetime_models"]["v100"].endswith(" fitted (aws:v100:us-east-1) (aws spot)")
    # lifetimes of half an hour instead of 1.6 h: more than twice the revocations over the same job
    assert after["revocations_mean"] > 2 * before["revocations_mean"] > 0
    catalog = _cli(tmp_path, "catalog", "--cloud", "aws", "--region", "us-east-1", "--gpu", "v100")
    assert "fitted from mine.csv" in catalog.stdout, catalog.stdout


CLI_CASES = ("empty", "unsorted", "unknown", "negative")  # the reader's own cases (test_spot_traces), via the CLI


@pytest.mark.parametrize("case", CLI_CASES)
def test_a_bad_trace_is_one_line(tmp_path, case):
    text, message = BAD[case]
    path = tmp_path / f"{case}.csv"
    path.write_text(text)
    res = _cli(tmp_path, "models", "fit", "lifetimes", "--trace", str(path), "--offering", "aws:v100")
    assert res.returncode == 1 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr and str(path) in res.stderr


def test_emulation_draws_from_a_fitted_offering():
    catalog = load_catalog()
    model = market_lifetime(catalog, "aws", "t4", "us-east-1").model
    draws = model.sample(np.random.default_rng(0), 4000)
    assert np.mean(draws) / 3600 == pytest.approx(1.83, rel=0.1)  # the g4dn trace: 136 server-hours, 74 preemptions
