"""Lifetimes of one simulated run's servers, with common random numbers across cluster sizes.

Each transient worker slot gets its lifetimes drawn up front, slot-major, one vectorized draw per worker
group: slot ``i`` of two configurations that differ only in size sees the same draws, so comparing them
compares the clusters, not the luck. A replacement on the slot's original GPU type takes the slot's next
draw; one on another type (a fallback) and a slot past its draws draw on demand, as a PS server does.

With a job start hour (time-of-day lifetime models) the draws are uniforms: the first of each slot is
inverted at the start hour (the initial servers launch then), the others when the replacement is ready,
through the model of that hour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cmdare.control import WorkerInfo
from cmdare.plan.spec import PS_SERVER

__all__ = ["LIFETIMES_PER_SLOT", "SlotLifetimes"]

#: Lifetimes pre-drawn per transient slot and run; a slot revoked more often draws more on demand.
LIFETIMES_PER_SLOT = 3


class SlotLifetimes:
    """The lifetime draws of one run (``now``: the run's simulated clock, for time-of-day models)."""

    def __init__(self, sim: Any, rng: np.random.Generator, now: Callable[[], float]):  # sim: the Simulator
        self.sim, self.rng, self.now = sim, rng, now
        self.by_hour = sim.start_hour is not None
        self._first: dict[int, float] = {}  # time-of-day runs: initial lifetime per transient slot
        self._pools = self._draw_uniforms() if self.by_hour else self._draw_lifetimes()
        self._same_type = [True] * len(sim._slots)  # slot still on its original GPU type

    def replaced(self, slot: int, gpu_type: str | None) -> None:
        """A replacement of ``gpu_type`` was asked for ``slot``: once off its original type, it draws on demand."""
        self._same_type[slot] = self._same_type[slot] and gpu_type == self.sim._specs[slot].gpu_type

    def draw(self, w: WorkerInfo) -> float:
        """A lifetime for the server of ``w`` (counted from its ready time): a worker's from its slot's draws,
        a PS server's on demand."""
        lifetimes = self.sim.models.lifetimes
        if w.server.role == "ps":
            region = self.sim.cluster.region
            if not self.by_hour:
                return float(lifetimes.sample(self.rng, PS_SERVER, region, 1)[0])
            return float(lifetimes.lifetimes_at(self.rng.random(1), PS_SERVER, region, self._hour())[0])
        gpu, region, same_type = w.server.gpu_type, w.server.region, self._same_type[w.slot]
        pool = self._pools.get(w.slot)
        if not self.by_hour:
            if same_type and pool:
                return pool.pop()
            return float(lifetimes.sample(self.rng, gpu, region, 1)[0])
        first = self._first.pop(w.slot, None)
        if first is not None:
            return first
        u = pool.pop() if same_type and pool else float(self.rng.random())
        return float(lifetimes.lifetimes_at(np.array([u]), gpu, region, self._hour())[0])

    def _hour(self) -> float:
        return (self.sim.start_hour + self.now() / 3600.0) % 24.0

    def _draw_lifetimes(self) -> dict[int, list[float]]:
        """Slot-major lifetimes for every transient slot, one vectorized draw per worker group."""
        out: dict[int, list[float]] = {}
        slot_id = 0
        for group in self.sim.cluster.workers:
            if group.transient:
                draws = self.sim.models.lifetimes.sample(self.rng, group.gpu, group.region,
                                                         group.count * LIFETIMES_PER_SLOT)
                rows = np.asarray(draws, dtype=float).reshape(group.count, LIFETIMES_PER_SLOT).tolist()
                for i in range(group.count):
                    out[slot_id + i] = rows[i][::-1]  # pop() from the end
            slot_id += group.count
        return out

    def _draw_uniforms(self) -> dict[int, list[float]]:
        """Time-of-day runs: the same slot-major uniforms as :meth:`_draw_lifetimes`; the first of each slot is
        inverted now into ``_first``."""
        out: dict[int, list[float]] = {}
        lifetimes = self.sim.models.lifetimes
        slot_id = 0
        for group in self.sim.cluster.workers:
            if group.transient:
                u = self.rng.random(group.count * LIFETIMES_PER_SLOT).reshape(group.count, LIFETIMES_PER_SLOT)
                first = lifetimes.lifetimes_at(u[:, 0], group.gpu, group.region, self.sim.start_hour).tolist()
                rows = u[:, 1:].tolist()
                for i in range(group.count):
                    self._first[slot_id + i] = first[i]
                    out[slot_id + i] = rows[i][::-1]
            slot_id += group.count
        return out
