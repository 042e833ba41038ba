"""Spot capacity from preemption traces (issue 32): a replacement waits as long as the trace's servers took to
come back, the planner's time shows it, and a replacement that cannot be had within --replacement-timeout
falls back as `cmdare train` does."""

from __future__ import annotations

import json

import numpy as np
import pytest
from plan_toys import run_cli

from cmdare.cloud.catalog import load_catalog
from cmdare.measure.spot_traces import capacity_gaps, load_bundled_trace
from cmdare.plan.adapters import QuantileLifetimes
from cmdare.plan.markets import OfferingLifetimes

JOB = ["plan", "simulate", "--model", "t2t_resnet32", "--steps", "1000000", "--workers", "v100:2,t4:2", "--ps", "1",
       "--transient", "--cloud", "aws", "--region", "us-east-1", "--runs", "30", "--json"]


def test_capacity_waits_are_drawn_from_the_trace_of_the_offering():
    aws = OfferingLifetimes(load_catalog(), "aws", fitted=QuantileLifetimes)
    rng = np.random.default_rng(0)
    waits = np.array([aws.capacity_wait(rng, "v100", "us-east-1") for _ in range(3000)])
    gaps, censored = capacity_gaps(load_bundled_trace("aws:v100"))
    assert np.median(waits) == pytest.approx(np.median(gaps[~censored]), rel=0.25)
    assert waits.max() <= gaps.max()
    assert aws.capacity_wait(rng, "l4", "us-east-1") == 0.0  # no trace: capacity is not modelled
    gcp = OfferingLifetimes(load_catalog(), "gcp", fitted=QuantileLifetimes)
    assert gcp.capacity_wait(rng, "k80", "us-east1") == 0.0  # preemptible: the measured bathtub, no trace
    override = OfferingLifetimes(load_catalog(), "aws", "5-10%", fitted=QuantileLifetimes)
    assert override.capacity_wait(rng, "v100", "us-east-1") == 0.0  # the user's rate replaces the trace


def _simulate(monkeypatch, capsys, *extra: str) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, *JOB, *extra)
    assert code == 0, err
    return json.loads(out)


def test_replacements_wait_for_capacity_or_fall_back_after_the_timeout(monkeypatch, capsys):
    waits = _simulate(monkeypatch, capsys)
    assert waits["replacement_timeout_s"] is None
    assert waits["replacements_mean"] == waits["revocations_mean"] > 5  # every loss replaced, however late
    # workers missing while their replacements wait: the P95 time is well past the revocation-free time
    assert waits["time_s"]["p95"] > 1.2 * waits["deterministic_time_s"]
    fallback = _simulate(monkeypatch, capsys, "--replacement-timeout", "1800", "--replace", "cheapest")
    assert fallback["replacement_timeout_s"] == 1800
    # a replacement not up within 30 min is given up and the cheapest GPU type asked for instead
    assert fallback["replacements_mean"] > fallback["revocations_mean"]
    code, _, err = run_cli(monkeypatch, capsys, *JOB, "--replacement-timeout", "0")
    assert code == 1 and "--replacement-timeout must be positive" in err
