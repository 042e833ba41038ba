"""The run's states: a reported state (:class:`RunState`, what the store and the progress show) and the
controller's phase, a value that carries its data (:data:`Phase`)::

    starting -> running -> finishing -> finished          (any state but finished -> failed)
                 |   ^
      revocation |   | replacement joined / chief re-elected / shards restored
                 v   |
          degraded / restoring (fewer workers, or shards rolled back to a checkpoint)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["TRANSITIONS", "Ended", "Finishing", "Holding", "Phase", "RunState", "RunStateMachine", "Starting",
           "Training"]


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
    """The current state and its history (``(time, state)``); refuses transitions :data:`TRANSITIONS` does
    not draw."""

    def __init__(self, time: float = 0.0) -> None:
        self.state = RunState.STARTING
        self.history: list[tuple[float, RunState]] = [(time, RunState.STARTING)]

    def to(self, new: RunState, time: float = 0.0) -> bool:
        """Move to ``new``; True when the state changed (staying put is allowed and returns False).

        Raises:
            RuntimeError: the transition is not in :data:`TRANSITIONS` (a controller bug).
        """
        if new == self.state:
            return False
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"run state {self.state} cannot move to {new}")
        self.state = new
        self.history.append((time, new))
        return True

    @property
    def done(self) -> bool:
        """Whether the run has ended (finished, failed or interrupted)."""
        return not TRANSITIONS[self.state]


@dataclass(frozen=True)
class Starting:
    """The first wave is being started."""


@dataclass(frozen=True)
class Training:
    """Workers train until ``fence`` (the next step something is due at)."""

    fence: int


@dataclass(frozen=True)
class Holding:
    """Workers stopped for actions on quiesced shards (``why``: what waits; ``running``: the one under way)."""

    why: tuple[str, ...]
    running: str | None = None


@dataclass(frozen=True)
class Finishing:
    """The target step is reached: the final duties run."""

    step: int


@dataclass(frozen=True)
class Ended:
    """The run ended (``status`` finished or failed; ``message``: why it failed)."""

    status: str
    message: str = ""


Phase = Starting | Training | Holding | Finishing | Ended
