"""Time as the policies see it: a clock protocol with a wall clock (the Ray trainer) and a manual
clock (tests); the simulator adapts SimPy's ``env.now`` to the same protocol."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "WallClock"]


@runtime_checkable
class Clock(Protocol):
    """Seconds, monotone within a run."""

    def now(self) -> float:
        """The current time in seconds."""
        ...


class WallClock:
    """Wall-clock seconds since the epoch (what the Ray trainer runs on)."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told (unit tests of the policies)."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time."""
        self.t += float(seconds)
        return self.t
