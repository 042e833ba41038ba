"""Warm spares in a simulated run (``--warm-spares N``), as the trainer keeps them
(:mod:`cmdare.train.workers.warm_pool`): ``N`` standby servers of the first wave's most common spec, billed from
their request like any server; a replacement of that spec takes the spare ready longest (else the one furthest
into its start, for the rest of its start-up) instead of starting cold, and a new spare is requested in its place
at once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from cmdare.cloud.servers import ServerSpec

__all__ = ["SimSpares"]


class SimSpares:
    """The spares of one simulated run: when each is (or will be) ready, in cloud seconds."""

    def __init__(self, n: int, worker_specs: Sequence[ServerSpec], startup_s: Callable[[ServerSpec], float],
                 now: float = 0.0):
        counts = Counter(worker_specs)
        self.spec = max(worker_specs, key=lambda s: counts[s]) if worker_specs else None
        self.startup_s = startup_s
        self.ready_at: list[float] = [now + startup_s(self.spec) for _ in range(n)] if self.spec else []
        self.taken = 0

    def __len__(self) -> int:
        return len(self.ready_at)

    def take(self, spec: ServerSpec, now: float) -> float | None:
        """A replacement of ``spec`` takes a spare: the seconds until it is ready (0: warm), or None (no spare of
        that spec: it starts cold). A new spare is requested in its place."""
        if not self.ready_at or spec != self.spec:
            return None
        ready = [t for t in self.ready_at if t <= now]
        pick = min(ready) if ready else min(self.ready_at)  # the longest ready, else the furthest into its start
        self.ready_at.remove(pick)
        self.ready_at.append(now + self.startup_s(self.spec))
        self.taken += 1
        return max(0.0, pick - now)
