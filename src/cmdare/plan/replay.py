"""Deterministic models for replaying a measured run in the simulator.

To check the simulator against a real (e.g. local, revocation-injected) cmdare run, give it what the
run saw: each worker's measured speed (and the PS capacity, if it saturated), the revocation times
of each server type in order, and the measured replacement delay::

    models = PlanModels(
        speed=MeasuredSpeed({"cpu-worker": 3.1}, ps_capacity_steps_per_s=None),
        lifetimes=ScriptedLifetimes({"cpu-worker": [40.0, 55.0]}),
        startup=FixedStartup(1.6),
        prices=FlatPrices({"cpu-worker": 0.0, "cpu": 0.0}),
        checkpoint_s=0.2,
    )
    Simulator(job, cluster, models).run_once(np.random.default_rng(0)).wall_time_s

Lifetimes are consumed in slot order (slot-major): the first ``count`` values go to the initial
servers of the first group ... then later values to replacements in the order they are requested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cmdare.errors import UnknownNameError

__all__ = ["FixedStartup", "FlatPrices", "MeasuredSpeed", "ScriptedLifetimes"]


class MeasuredSpeed:
    """Workers add their measured speeds, up to ``ps_capacity_steps_per_s * ps`` (if given)."""

    def __init__(self, worker_steps_per_s: Mapping[str, float], ps_capacity_steps_per_s: float | None = None):
        self.speeds = dict(worker_steps_per_s)
        self.cap = ps_capacity_steps_per_s

    def worker_steps_per_s(self, gpu: str) -> float:
        """The measured speed of one ``gpu`` worker."""
        if gpu not in self.speeds:
            raise UnknownNameError("worker type", gpu, self.speeds)
        return self.speeds[gpu]

    def cluster_steps_per_s(self, gpus: Mapping[str, int], ps: int) -> float:
        """Sum of worker speeds, capped by the PS capacity."""
        total = sum(n * self.worker_steps_per_s(g) for g, n in gpus.items())
        return total if ps == 0 or self.cap is None else min(total, self.cap * ps)


class ScriptedLifetimes:
    """Per server type, the listed lifetimes (s) in order, then ``default`` (never revoked) forever."""

    def __init__(self, script: Mapping[str, Sequence[float]] | None = None, default: float = np.inf):
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.default = default

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """The next ``size`` scripted lifetimes of ``server``."""
        queue = self.script.setdefault(server, [])
        return np.array([queue.pop(0) if queue else self.default for _ in range(size)], dtype=float)


class FixedStartup:
    """Every replacement takes ``delay_s``."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        """The fixed delay."""
        return self.delay_s


class FlatPrices:
    """USD/h per server type, the same in every region; transient costs ``discount`` x on-demand."""

    def __init__(self, prices_per_hour_usd: Mapping[str, float], discount: float = 1.0):
        self.prices, self.discount = dict(prices_per_hour_usd), discount

    def price_per_hour_usd(self, server: str, region: str, transient: bool) -> float:
        """The flat price."""
        if server not in self.prices:
            raise UnknownNameError("server type", server, self.prices)
        return self.prices[server] * (self.discount if transient else 1.0)
