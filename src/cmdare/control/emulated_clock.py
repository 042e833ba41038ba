"""Emulated cloud time: a clock that advances with the run's training, not with the emulator's overheads.

A local run emulates cloud servers: their lifetimes, start-up phases and notice leads are cloud seconds.
Counting them on the wall clock makes the emulation depend on the machine: a replacement's real process
start (a Ray node, a Python process importing torch: seconds) would age the server by hours once
lifetimes are compressed, and a slower machine would see more revocations per step. So cloud time is a
function of training progress instead: each global step advances it by ``1 / rate`` seconds, where
``rate`` is the emulated cluster's speed (steps per cloud second of its members, from each worker's
GPU type). Nothing else moves it, except that when no member can train (all lost, or the last shard
parked) it jumps to the next cloud event. A seeded emulated run therefore revokes the same servers at the
same global steps on any machine, however fast or loaded.
"""

from __future__ import annotations

import math

__all__ = ["EmulatedClock"]

_EPS = 1e-9


class EmulatedClock:
    """Cloud seconds as a function of the global step (piecewise linear, one slope per membership)."""

    def __init__(self, step: float = 0, time: float = 0.0):
        self.step = float(step)
        self.time = float(time)

    def advance(self, step: float, rate: float) -> float:
        """Training reached ``step`` at ``rate`` steps per cloud second; returns the cloud time then."""
        if step > self.step:
            if rate > 0:
                self.time += (step - self.step) / rate
            self.step = float(step)
        return self.time

    def rebase(self, step: float) -> None:
        """The global step went back (shards rolled back to a checkpoint): time goes on from here."""
        self.step = float(step)

    def jump(self, time: float) -> float:
        """Nothing trains: cloud time moves to ``time`` (never backwards)."""
        self.time = max(self.time, float(time))
        return self.time

    def time_at(self, step: float, rate: float) -> float:
        """The cloud time at ``step`` if training goes on at ``rate`` (infinite when nothing trains)."""
        if step <= self.step:
            return self.time
        return self.time + (step - self.step) / rate if rate > 0 else math.inf

    def step_at(self, time: float, rate: float) -> int | None:
        """The first whole step at which cloud time reaches ``time`` at ``rate`` (None: never)."""
        if time <= self.time + _EPS:
            return int(math.ceil(self.step - _EPS))
        if rate <= 0 or not math.isfinite(time):
            return None
        return int(math.ceil(self.step + (time - self.time) * rate - _EPS))
