"""Deadlines on a run's real waits: no news from the cluster, no answer to a probe, no progress.

A blocked Ray call, a node marked dead or a hung worker must end a run with a message, never make it wait
forever. Wall time comes in with every call (the driver's clock), so a test steps the deadlines in
milliseconds.
"""

from __future__ import annotations

from cmdare.control.run_commands import Probe

__all__ = ["Liveness"]


class Liveness:
    """News, progress and probe times of a run, and what their deadlines call for.

    Args:
        probe_after_s: wall seconds without news before the workers, shards and cluster are probed (and
            without an answer to the probe before the run fails).
        stuck_after_s: wall seconds without progress, though everything answers, before the run fails.
    """

    def __init__(self, probe_after_s: float, stuck_after_s: float):
        self.probe_after_s, self.stuck_after_s = probe_after_s, stuck_after_s
        self.heard_wall = 0.0  # the last news from the cluster
        self.progress_wall = 0.0  # the last time the step went up (or an action ended)
        self.probe_wall: float | None = None  # a Probe is out since then

    def restart(self, wall: float) -> None:
        """Training (re)starts: the silence and progress deadlines count from ``wall``."""
        self.heard_wall = self.progress_wall = wall

    def heard(self, wall: float) -> None:
        """A sign of life from the cluster (a failure report is none)."""
        self.heard_wall = wall

    def progressed(self, wall: float) -> None:
        self.progress_wall = wall

    def answered(self, wall: float) -> None:
        """The probe returned: its answer is news, what it found (a lost worker or shard) the controller's to act
        on, so the silence deadline counts again from ``wall``. (Probing again at once, before the loss is acted
        on, found the same loss again, and again: the driver never got back to Ray's results.)"""
        self.probe_wall = None
        self.heard_wall = wall

    def next_wall(self) -> float:
        """The wall time the next deadline falls at."""
        return (self.probe_wall if self.probe_wall is not None else self.heard_wall) + self.probe_after_s

    def failure(self, wall: float, busy: bool, step: int) -> str | None:
        """Why the run must fail now (no answer to a probe; no progress past ``step`` while ``busy`` training
        or acting), or None."""
        if self.probe_wall is not None and wall - self.probe_wall >= self.probe_after_s:
            return (f"no answer from the cluster for {wall - self.probe_wall:.0f} s (a probe of the workers and "
                    "shards did not return)")
        if busy and wall - self.progress_wall >= self.stuck_after_s:
            return (f"no training progress for {wall - self.progress_wall:.0f} s at step {step}, though the workers "
                    "and shards answer")
        return None

    def probe(self, wall: float) -> Probe | None:
        """A probe, when nothing was heard for ``probe_after_s`` and none is out."""
        if self.probe_wall is None and wall - self.heard_wall >= self.probe_after_s:
            self.probe_wall = wall
            return Probe(wall - self.heard_wall, why=f"nothing heard for {wall - self.heard_wall:.0f} s")
        return None
