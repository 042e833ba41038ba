"""Warm spares (``--warm-spares N``): standby servers whose worker process is started before it is needed.

The policy, the same for the trainer and the simulator: the run asks for ``N`` spares of the first wave's most
common server spec with the first wave, billed from their request like any server. A replacement of that spec takes
the spare that has been up longest, else the one furthest into its start (it has a head start on a cold server).

The pool then sizes itself, up to ``N`` (:meth:`WarmSpares.wanted`): one spare for a loss nobody saw coming, plus
the losses due while a spare asked for now starts: the members whose drawn lifetime ends within that start (an
emulated run's lifetime model), or the loss rate seen so far times that start, whichever is more. A spare's start
is its modelled start-up (an emulated run's drawn one, so the trainer and its simulation size alike), else what its
start took (request to warm process, a real cluster's, or a local one's with no emulated start-up); the first
wave's spares are not timed (their start, like the first wave's, is no part of the run). The pool is
topped up to that size as soon as a spare is taken or a worker is lost, all at once; a notice asks for one more at
once, for the noticed server's replacement. A spare that dies is replaced; after
:data:`MAX_FAILED_STARTS` spares in a row that died before they were up the pool gives up (a cluster that cannot
start them would only bill them). The drivers carry it out: ``StartSpare`` asks for a spare, ``StartWorker(spare=K)``
makes spare ``K``'s server and process the replacement's; they report ``ServerStarting(spare=K)``, ``SpareUp`` and
``SpareLost``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.run_commands import Command, StartSpare

__all__ = ["MAX_FAILED_STARTS", "Spare", "WarmSpares", "spare_spec"]

MAX_FAILED_STARTS = 3  # spares in a row that died before they were up, before the pool stops asking for them
RATE_WINDOW = 5  # the loss rate is measured over the last this many losses


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
    modelled: bool = False  # ready_at is a modelled start-up (emulated), not a measured one
    first_wave: bool = False  # asked for with the first wave: its start, like the first wave's, is no part of the run

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
        self.started_at: float | None = None  # when the first wave asked for the first spares
        self.losses: list[float] = []  # when workers were lost (the last RATE_WINDOW + 1)
        self.starts: list[float] = []  # what spares' starts took (the last RATE_WINDOW)

    def start(self, worker_specs: Sequence[ServerSpec], now: float) -> None:
        """The first spares, with the first wave."""
        if self.size <= 0 or not worker_specs:
            return
        self.spec, self.started_at = spare_spec(worker_specs), now
        for _ in range(self.size):
            self._request(now, "one of the run's warm spares, asked for with the first wave", first_wave=True)

    def snapshot(self) -> dict[str, Any]:
        """The pool as JSON-able values (saved with a checkpoint)."""
        return {"spec": self.spec.as_dict() if self.spec is not None else None, "next_key": self._next_key,
                "taken": self.taken, "failed_starts": self.failed_starts, "closed": self.closed,
                "spares": [[s.key, s.requested_at, s.ready_at, s.up_at, s.modelled] for s in self.spares.values()],
                "started_at": self.started_at, "losses": self.losses, "starts": self.starts}

    def resume(self, saved: dict[str, Any]) -> None:
        """A resumed run's pool is the saved one (:meth:`snapshot`): each spare is asked for again, under its key,
        ready and warm when it was (emulated time did not pass while the run was stopped)."""
        if self.size <= 0 or saved.get("spec") is None:
            return
        self.spec = ServerSpec.from_dict(saved["spec"])
        self._next_key, self.taken = saved["next_key"], saved["taken"]
        self.failed_starts, self.closed = saved["failed_starts"], saved["closed"]
        self.started_at = saved.get("started_at")
        self.losses, self.starts = list(saved.get("losses", [])), list(saved.get("starts", []))
        for key, requested_at, ready_at, up_at, *modelled in saved["spares"]:
            self.spares[key] = Spare(key, self.spec, requested_at, ready_at, up_at, resumed=True,
                                     modelled=bool(modelled and modelled[0]))
            self.out.append(StartSpare(key, self.spec, True, why=f"spare {key} of the resumed run"))

    def _request(self, now: float, why: str, first_wave: bool = False) -> None:
        key, self._next_key = self._next_key, self._next_key + 1
        self.spares[key] = Spare(key, self.spec, now, first_wave=first_wave)  # type: ignore[arg-type]  # start() set it
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

    def start_s(self) -> float | None:
        """What a spare's start takes (median of the last :data:`RATE_WINDOW`; None before one was up)."""
        return statistics.median(self.starts) if self.starts else None

    def loss_rate(self, now: float) -> float:
        """Workers lost per second over the last :data:`RATE_WINDOW` losses (0 before the first)."""
        recent = self.losses[-RATE_WINDOW:]
        since = self.losses[-RATE_WINDOW - 1] if len(self.losses) > RATE_WINDOW else self.started_at
        if not recent or since is None or now <= since:
            return 0.0
        return len(recent) / (now - since)

    def wanted(self, now: float, deadlines: Iterable[float] = ()) -> int:
        """How many spares the pool keeps now, up to its size: one, plus the losses due while a spare asked for now
        starts (the members' known ``deadlines`` within that start, or the loss rate times it to the nearest whole
        loss, whichever is more).
        The full size while no spare's start is known yet."""
        start = self.start_s()
        if start is None:
            return self.size
        due = sum(1 for d in deadlines if now <= d <= now + start)
        expected = max(due, math.floor(self.loss_rate(now) * start + 0.5))  # the expected losses, to the nearest
        return max(0, min(self.size, 1 + expected))

    def top_up(self, now: float, why: str, deadlines: Iterable[float] = ()) -> None:
        """Ask for spares, all at once, until the pool holds :meth:`wanted` (none once the pool gave up)."""
        if self.closed or self.spec is None:
            return
        for _ in range(self.wanted(now, list(deadlines)) - len(self.spares)):
            self._request(now, why)

    def refill(self, taken: Spare, now: float, deadlines: Iterable[float] = ()) -> None:
        """Spares in the place of the ``taken`` one, up to :meth:`wanted`."""
        self.top_up(now, f"spare {taken.key} was taken by a replacement: the pool is topped up", deadlines)

    def worker_lost(self, now: float) -> None:
        """A worker was lost (revoked, noticed, failed): counted in the loss rate."""
        if self.size > 0:
            self.losses = [*self.losses[-RATE_WINDOW:], now]

    def noticed(self, now: float, why: str = "a worker's server was noticed") -> None:
        """A worker's server got a notice (or is at risk: an AWS rebalance recommendation): one more spare at once
        (beyond :meth:`wanted`, up to the pool's size), so that its replacement finds one further into its start."""
        if not self.closed and self.spec is not None and len(self.spares) < self.size:
            self._request(now, f"{why}: a spare for its replacement, at once")

    def starting(self, key: int, startup_s: float | None, now: float) -> None:
        """Spare ``key``'s server is ready ``startup_s`` after ``now`` (None: when its process is up)."""
        spare = self.spares.get(key)
        if spare is not None and not (spare.resumed and spare.ready_at is not None):
            spare.ready_at = None if startup_s is None else now + max(0.0, startup_s)
            spare.modelled = bool(startup_s)  # an emulated start-up of 0 says nothing of the start: it is measured

    def up(self, key: int, now: float) -> None:
        """Spare ``key``'s process is warm."""
        spare = self.spares.get(key)
        if spare is not None and not (spare.resumed and spare.up_at is not None):
            spare.up_at = now
            spare.ready_at = now if spare.ready_at is None else spare.ready_at
            self.failed_starts = 0
            if not spare.first_wave:  # the first wave's start is no part of the run (the drivers time it apart)
                took = (spare.ready_at if spare.modelled else now) - spare.requested_at
                self.starts = [*self.starts[-RATE_WINDOW + 1:], max(0.0, took)]

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
