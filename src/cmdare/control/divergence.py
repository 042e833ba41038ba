"""When training has diverged: what a user would call divergence, not only a loss that is already NaN.

A run whose loss grew to 7.5e15, or whose parameters went non-finite while the loss stayed finite, used to
train on and end ``finished``. :class:`DivergenceWatch` says a run diverged when

* a training loss or a test loss is not finite, or a worker found non-finite parameters (``ChunkDone``);
* a training loss (a chunk's mean) exceeds :data:`GROWTH_BOUND` times its *level*: the larger of the run's
  first chunk loss and the median of the last :data:`WINDOW` chunk losses. A growth that large is no spike: a
  cross-entropy loss 100 times its starting 2.3 is a model confidently wrong everywhere, and a regression's
  100 times its untrained error is worse than predicting zero;
* a test loss exceeds the same bound over the level (an evaluation of an exploded model).

The bound applies to positive losses only: a loss that may be negative (a log-likelihood) is checked for
finiteness alone. The controller then acts per ``--on-diverge`` (stop with one line, or roll back).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["GROWTH_BOUND", "WINDOW", "DivergenceWatch"]

GROWTH_BOUND = 100.0  # a loss this many times its level has diverged
WINDOW = 20  # chunk losses whose median is the recent level


@dataclass
class DivergenceWatch:
    """Chunk losses seen so far and the verdict on a new one (pure: no clock)."""

    bound: float = GROWTH_BOUND
    first: float | None = None  # the first chunk loss of this part of the run
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    why: str = ""  # the last divergence, in words (``worker 1's loss is nan at step 57``)

    def level(self) -> float | None:
        """The loss level a new loss is measured against (None: none yet, or not a positive loss)."""
        if self.first is None or self.first <= 0:
            return None
        return max(self.first, statistics.median(self.recent)) if self.recent else self.first

    def training(self, loss: float | None, params_finite: bool = True) -> str | None:
        """A chunk's mean training loss (None: the chunk trained no step): why it diverged, or None (and the
        loss counts towards the level)."""
        if not params_finite:
            return "its parameters are not finite" + ("" if loss is None else f" (loss {_number(loss)})")
        if loss is None:
            return None
        why = self._verdict(loss, "loss", "its level")
        if why is None:
            self.first = loss if self.first is None else self.first
            self.recent.append(loss)
        return why

    def test(self, loss: float | None) -> str | None:
        """An evaluation's test loss: why it shows divergence, or None."""
        return None if loss is None else self._verdict(loss, "test loss", "the training loss level")

    def _verdict(self, loss: float, what: str, level_name: str) -> str | None:
        if not math.isfinite(loss):
            return f"{what} is {loss}"
        level = self.level()
        if level is not None and loss > self.bound * level:
            return f"{what} is {_number(loss)}, over {self.bound:g}x {level_name} of {_number(level)}"
        return None

    def rolled_back(self) -> None:
        """Training went back to a checkpoint: the losses of the steps since no longer describe the model."""
        self.recent.clear()


def _number(value: float) -> str:
    return f"{value:.3g}"
