"""The run's states and the transitions between them (the coordinator's state machine)::

    starting -> running -> finishing -> finished          (any state but finished -> failed)
                 |   ^
      revocation |   | replacement joined / chief re-elected / shards restored
                 v   |
          degraded / restoring (fewer workers, or shards rolled back to a checkpoint)
"""

from __future__ import annotations

import time
from enum import StrEnum

__all__ = ["RunState", "RunStateMachine", "TRANSITIONS"]


class RunState(StrEnum):
    """Where a run is."""

    STARTING = "starting"
    RUNNING = "running"
    DEGRADED = "degraded"  # fewer workers than planned; training goes on
    RESTORING = "restoring"  # a shard died: every shard rolls back to the latest checkpoint
    FINISHING = "finishing"  # the target step is reached: final evaluation and checkpoint
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


_ACTIVE = (RunState.RUNNING, RunState.DEGRADED, RunState.RESTORING)

#: state -> the states it may move to.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.FAILED, RunState.INTERRUPTED}),
    **{s: frozenset({*_ACTIVE, RunState.FINISHING, RunState.FAILED, RunState.INTERRUPTED} - {s}) for s in _ACTIVE},
    RunState.FINISHING: frozenset({RunState.FINISHED, RunState.FAILED, RunState.INTERRUPTED}),
    RunState.FINISHED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.INTERRUPTED: frozenset(),
}


class RunStateMachine:
    """The current state and its history; refuses transitions :data:`TRANSITIONS` does not draw."""

    def __init__(self) -> None:
        self.state = RunState.STARTING
        self.history: list[tuple[float, RunState]] = [(time.time(), RunState.STARTING)]

    def to(self, new: RunState) -> bool:
        """Move to ``new``; True when the state changed (staying put is allowed and returns False).

        Raises:
            RuntimeError: the transition is not in :data:`TRANSITIONS` (a coordinator bug).
        """
        if new == self.state:
            return False
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"run state {self.state} cannot move to {new}")
        self.state = new
        self.history.append((time.time(), new))
        return True

    @property
    def done(self) -> bool:
        """Whether the run has ended (finished, failed or interrupted)."""
        return not TRANSITIONS[self.state]
