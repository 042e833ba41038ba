"""Warm spares (``--warm-spares N``): standby servers whose worker process is started before it is needed.

The policy, the same for the trainer and the simulator: the run keeps ``N`` spares of the first wave's most common
server spec, asked for with the first wave and billed from their request like any server. A replacement of that
spec takes the spare that has been up longest, else the one furthest into its start (it has a head start on a
cold server), and a new spare is asked for in its place at once. A spare that dies is replaced; after
:data:`MAX_FAILED_STARTS` spares in a row that died before they were up the pool gives up (a cluster that cannot
start them would only bill them). The drivers carry it out: ``StartSpare`` asks for a spare, ``StartWorker(spare=K)``
makes spare ``K``'s server and process the replacement's; they report ``ServerStarting(spare=K)``, ``SpareUp`` and
``SpareLost``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.run_commands import Command, StartSpare

__all__ = ["MAX_FAILED_STARTS", "Spare", "WarmSpares", "spare_spec"]

MAX_FAILED_STARTS = 3  # spares in a row that died before they were up, before the pool stops asking for them


def spare_spec(worker_specs: Sequence[ServerSpec]) -> ServerSpec:
    """The server spec of the spares: the first wave's most common one (ties: the lowest slot's)."""
    counts = Counter(worker_specs)
    return max(worker_specs, key=lambda s: counts[s])


@dataclass
class Spare:
    """One spare: asked for at ``requested_at`` (cloud time); its server ready at ``ready_at`` (None: not known);
    its process up (warm) since ``up_at`` (None: still starting)."""

    key: int
    spec: ServerSpec
    requested_at: float
    ready_at: float | None = None
    up_at: float | None = None
    resumed: bool = False  # the saved run's spare, asked for again by a resumed run: its times are that run's

    def head_start(self) -> tuple[bool, float]:
        """Sort key: up ones first, the longest up first; then the one furthest into its start."""
        if self.up_at is not None:
            return False, self.up_at
        return True, self.ready_at if self.ready_at is not None else self.requested_at


class WarmSpares:
    """The run's spares and the decisions about them; appends its commands to ``out``."""

    def __init__(self, size: int, out: list[Command]):
        self.size, self.out = size, out
        self.spec: ServerSpec | None = None
        self.spares: dict[int, Spare] = {}
        self.taken = 0  # replacements that took a spare
        self.failed_starts = 0  # spares in a row that died before they were up
        self.closed = False
        self._next_key = 0

    def start(self, worker_specs: Sequence[ServerSpec], now: float) -> None:
        """The first spares, with the first wave."""
        if self.size <= 0 or not worker_specs:
            return
        self.spec = spare_spec(worker_specs)
        for _ in range(self.size):
            self._request(now, "one of the run's warm spares, asked for with the first wave", first_wave=True)

    def snapshot(self) -> dict[str, Any]:
        """The pool as JSON-able values (saved with a checkpoint)."""
        return {"spec": self.spec.as_dict() if self.spec is not None else None, "next_key": self._next_key,
                "taken": self.taken, "failed_starts": self.failed_starts, "closed": self.closed,
                "spares": [[s.key, s.requested_at, s.ready_at, s.up_at] for s in self.spares.values()]}

    def resume(self, saved: dict[str, Any]) -> None:
        """A resumed run's pool is the saved one (:meth:`snapshot`): each spare is asked for again, under its key,
        ready and warm when it was (emulated time did not pass while the run was stopped)."""
        if self.size <= 0 or saved.get("spec") is None:
            return
        self.spec = ServerSpec.from_dict(saved["spec"])
        self._next_key, self.taken = saved["next_key"], saved["taken"]
        self.failed_starts, self.closed = saved["failed_starts"], saved["closed"]
        for key, requested_at, ready_at, up_at in saved["spares"]:
            self.spares[key] = Spare(key, self.spec, requested_at, ready_at, up_at, resumed=True)
            self.out.append(StartSpare(key, self.spec, True, why=f"spare {key} of the resumed run"))

    def _request(self, now: float, why: str, first_wave: bool = False) -> None:
        key, self._next_key = self._next_key, self._next_key + 1
        self.spares[key] = Spare(key, self.spec, now)  # type: ignore[arg-type]  # start() set it
        self.out.append(StartSpare(key, self.spec, first_wave, why=why))  # type: ignore[arg-type]

    def take(self, spec: ServerSpec) -> Spare | None:
        """The spare a replacement of ``spec`` takes (None: none of that spec: it starts cold); :meth:`refill`
        asks for another in its place once the replacement is asked for."""
        mine = [s for s in self.spares.values() if s.spec == spec]
        if not mine:
            return None
        spare = min(mine, key=Spare.head_start)
        del self.spares[spare.key]
        self.taken += 1
        return spare

    def refill(self, taken: Spare, now: float) -> None:
        """Another spare in the place of the ``taken`` one (none once the pool gave up)."""
        if not self.closed:
            self._request(now, f"spare {taken.key} was taken by a replacement: another in its place")

    def starting(self, key: int, startup_s: float | None, now: float) -> None:
        """Spare ``key``'s server is ready ``startup_s`` after ``now`` (None: when its process is up)."""
        spare = self.spares.get(key)
        if spare is not None and not (spare.resumed and spare.ready_at is not None):
            spare.ready_at = None if startup_s is None else now + max(0.0, startup_s)

    def up(self, key: int, now: float) -> None:
        """Spare ``key``'s process is warm."""
        spare = self.spares.get(key)
        if spare is not None and not (spare.resumed and spare.up_at is not None):
            spare.up_at = now
            spare.ready_at = now if spare.ready_at is None else spare.ready_at
            self.failed_starts = 0

    def lost(self, key: int, now: float) -> None:
        """Spare ``key`` died (its server went away, or its process): another is asked for, unless
        :data:`MAX_FAILED_STARTS` died in a row before they were up."""
        spare = self.spares.pop(key, None)
        if spare is None:
            return
        if spare.up_at is None:
            self.failed_starts += 1
        if self.failed_starts >= MAX_FAILED_STARTS:
            self.closed = True
        if not self.closed:
            self._request(now, f"spare {key} died: another in its place")
