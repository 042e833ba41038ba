"""Deterministic toy models for the planner's unit tests (imported by the test modules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cmdare.plan.spec import PlanModels


class ToySpeed:
    """Workers add their speeds up to ``cap_per_ps * ps`` steps/s."""

    def __init__(self, speeds: Mapping[str, float], cap_per_ps: float = 1e9):
        self.speeds, self.cap = dict(speeds), cap_per_ps

    def worker_steps_per_s(self, gpu: str) -> float:
        return self.speeds[gpu]

    def cluster_steps_per_s(self, gpus: Mapping[str, int], ps: int) -> float:
        total = sum(n * self.speeds[g] for g, n in gpus.items())
        return total if ps == 0 else min(total, self.cap * ps)


class ScriptedLifetimes:
    """Per server type, the listed lifetimes in order, then ``default`` forever."""

    def __init__(self, script: Mapping[str, Sequence[float]] | None = None, default: float = np.inf):
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.default = default

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        queue = self.script.setdefault(server, [])
        return np.array([queue.pop(0) if queue else self.default for _ in range(size)], dtype=float)


class ExpLifetimes:
    """Exponential lifetimes with a fixed mean, capped at 24 h."""

    def __init__(self, mean_s: float):
        self.mean_s = mean_s

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        return np.minimum(rng.exponential(self.mean_s, size), 86400.0)


class FixedStartup:
    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        return self.delay_s


class FlatPrices:
    """USD/h per server type; transient servers cost ``discount`` of on-demand."""

    def __init__(self, prices: Mapping[str, float], discount: float = 0.5):
        self.prices, self.discount = dict(prices), discount

    def price_per_hour_usd(self, server: str, region: str, transient: bool) -> float:
        return self.prices[server] * (self.discount if transient else 1.0)


def toy_models(lifetimes=None, startup_s: float = 50.0, checkpoint_s: float = 0.0, cap_per_ps: float = 1e9):
    """Speeds a=1, b=2 steps/s; prices a=3.6, b=7.2, cpu=0.36 USD/h on demand (0.001, 0.002, 0.0001 /s)."""
    return PlanModels(
        speed=ToySpeed({"a": 1.0, "b": 2.0}, cap_per_ps),
        lifetimes=lifetimes or ScriptedLifetimes(),
        startup=FixedStartup(startup_s),
        prices=FlatPrices({"a": 3.6, "b": 7.2, "cpu": 0.36}),
        checkpoint_s=checkpoint_s,
        source="toy",
    )
