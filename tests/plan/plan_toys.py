"""Deterministic toy models and a CLI runner for the planner's unit tests (imported by the test modules)."""

from __future__ import annotations

import sys

import numpy as np

from cmdare import cli
from cmdare.plan.replay import FixedStartup, FlatPrices, ScriptedLifetimes
from cmdare.plan.replay import MeasuredSpeed as ToySpeed
from cmdare.plan.spec import PlanModels

__all__ = ["ExpLifetimes", "FixedStartup", "FlatPrices", "ScriptedLifetimes", "ToySpeed", "run_cli", "toy_models"]


def _exit_status(code: object) -> int:
    """The process exit status ``sys.exit(code)`` gives: None is 0, an int itself, anything else 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``cmdare ARGS`` through the real entry point; returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["cmdare", *args])
    monkeypatch.setenv("COLUMNS", "300")  # one line means one line, not Rich wrapping at 80
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = _exit_status(exc.code)
    out = capsys.readouterr()
    return code, out.out, out.err


class ExpLifetimes:
    """Exponential lifetimes with a fixed mean, capped at 24 h."""

    def __init__(self, mean_s: float):
        self.mean_s = mean_s

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        return np.minimum(rng.exponential(self.mean_s, size), 86400.0)


def toy_models(lifetimes=None, startup_s: float = 50.0, checkpoint_s: float = 0.0, cap_per_ps: float = 1e9):
    """Speeds a=1, b=2 steps/s; prices a=3.6, b=7.2, cpu=0.36 USD/h on demand (0.001, 0.002, 0.0001 /s)."""
    return PlanModels(
        speed=ToySpeed({"a": 1.0, "b": 2.0}, cap_per_ps),
        lifetimes=lifetimes or ScriptedLifetimes(),
        startup=FixedStartup(startup_s),
        prices=FlatPrices({"a": 3.6, "b": 7.2, "cpu": 0.36}, discount=0.5),
        checkpoint_s=checkpoint_s,
        source="toy",
    )
