"""Chief election: who checkpoints and evaluates after the chief is lost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cmdare.control.membership import WorkerInfo
from cmdare.control.registry import Registry

__all__ = ["CHIEF_POLICIES", "ChiefPolicy", "LongestServing"]


class ChiefPolicy(Protocol):
    """Picks the chief among the live workers (None when none is left)."""

    name: str

    def elect(self, workers: Sequence[WorkerInfo]) -> int | None:
        """The new chief's worker id."""
        ...


CHIEF_POLICIES: Registry[ChiefPolicy] = Registry("chief election policy")


@CHIEF_POLICIES.register("longest-serving", "oldest")
class LongestServing:
    """The worker whose server has been ready longest; ties (servers of the first wave) go to the
    lowest worker id. A replacement never takes the role from a worker that served before it."""

    name = "longest-serving"

    def elect(self, workers: Sequence[WorkerInfo]) -> int | None:
        best = min(workers, key=lambda w: (w.ready_at, w.worker_id), default=None)
        return best.worker_id if best is not None else None
