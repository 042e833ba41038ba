"""Revocation traces: recorded (or published) revocations that drive emulation and the planner alike.

The trace format is a CSV with a header and one event per row::

    time_s,server,event
    3600,0,revoke          # the worker in data slot 0, one hour after the first step
    5400,k80,notice        # a K80 server (the lowest live slot of that GPU type) gets its notice ...
    5430,k80,revoke        # ... and is revoked 30 s later
    9000,*,revoke          # any transient worker (the lowest live slot)
    12000,*,available      # the market has capacity again (recorded; replacements are not held back)

``time_s`` counts from the job's first step (``cmdare train`` divides it by ``speedup``, like
lifetimes); ``server`` is a data slot (a whole number), a server type (GPU name, case-insensitive;
``cpu`` for a parameter server) or ``*`` (any transient worker); ``event`` is ``notice``, ``revoke``
or ``available``. Replay revokes at the ``revoke`` events; ``notice`` and ``available`` events are
kept as data (:attr:`RevocationTrace.events`).

:func:`read_cbl_json` imports the per-tick traces published with the Can't Be Late study (Wu et al.,
NSDI 2024; github.com/skypilot-org/spot-traces): ``{"metadata": {"gap_seconds": N}, "data": [...]}``
with one value per tick of ``N`` seconds. The study's simulator reads a tick's value as *spot
unavailable / preempted* when it is non-zero (``spot_available() = not trace[tick]``), so 0 = available,
1 = preempted; a multi-node trace's value is read as the number of preempted instances. A rise by
``k`` is ``k`` ``revoke`` events of ``server`` at that tick's time, a fall by ``k`` is ``k``
``available`` events; the state at tick 0 is the initial state (no event).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from cmdare.errors import DataFormatError, DataNotFoundError

__all__ = ["ANY_SERVER", "TRACE_EVENTS", "RevocationTrace", "TraceEvent", "load_revocation_trace", "read_cbl_json",
           "read_trace_csv", "write_trace_csv"]

TRACE_EVENTS = ("notice", "revoke", "available")
ANY_SERVER = "*"
_HEADER = ("time_s", "server", "event")


@dataclass(frozen=True)
class TraceEvent:
    """One trace row: ``time_s`` after the first step, the server it names and what happened."""

    time_s: float
    server: str
    event: str

    @property
    def target(self) -> int | str | None:
        """Whom a revocation hits: a data slot (int), a server type (lower case) or None (any worker)."""
        text = self.server.strip()
        if text in ("", ANY_SERVER):
            return None
        return int(text) if text.isdigit() else text.lower()


@dataclass(frozen=True)
class RevocationTrace:
    """A revocation trace: its events in time order and where it came from."""

    events: tuple[TraceEvent, ...]
    source: str = ""

    def schedule(self) -> tuple[tuple[float, int | str | None], ...]:
        """``(time_s, target)`` of every ``revoke`` event, in time order (a :class:`TraceRevocations` schedule)."""
        return tuple((e.time_s, e.target) for e in self.events if e.event == "revoke")

    def times(self, event: str) -> list[float]:
        """Times of every ``event`` (``notice``, ``revoke`` or ``available``)."""
        return [e.time_s for e in self.events if e.event == event]


def _check(events: list[TraceEvent], where: str) -> RevocationTrace:
    if not any(e.event == "revoke" for e in events):
        raise DataFormatError(f"{where}: no revoke events")
    return RevocationTrace(tuple(sorted(events, key=lambda e: e.time_s)), where)


def read_trace_csv(path: str | Path) -> RevocationTrace:
    """Read a trace CSV (``time_s,server,event``).

    Raises:
        DataNotFoundError: no such file.
        DataFormatError: a bad header, time, event or slot (the message names the line).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataNotFoundError(f"revocation trace not found: {path}")
    events = []
    with path.open(newline="") as fh:
        rows = csv.reader(line for line in fh if line.strip() and not line.lstrip().startswith("#"))
        header = tuple(c.strip().lower() for c in next(rows, ()))
        if header != _HEADER:
            raise DataFormatError(f"{path}: the first line must be the header {','.join(_HEADER)}, got {header}")
        for n, row in enumerate(rows, start=2):
            if len(row) != 3:
                raise DataFormatError(f"{path} line {n}: expected 3 fields time_s,server,event, got {row}")
            time_text, server, event = (c.strip() for c in row)
            try:
                time_s = float(time_text)
            except ValueError:
                raise DataFormatError(f"{path} line {n}: time_s {time_text!r} is not a number") from None
            if not time_s >= 0 or time_s == float("inf"):
                raise DataFormatError(f"{path} line {n}: time_s must be finite and >= 0, got {time_text}")
            if event.lower() not in TRACE_EVENTS:
                raise DataFormatError(f"{path} line {n}: event {event!r}; valid: {', '.join(TRACE_EVENTS)}")
            events.append(TraceEvent(time_s, server or ANY_SERVER, event.lower()))
    return _check(events, str(path))


def write_trace_csv(trace: RevocationTrace, path: str | Path) -> Path:
    """Write ``trace`` as a trace CSV; returns the path."""
    path = Path(path).expanduser()
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(_HEADER)
        for e in trace.events:
            out.writerow([f"{e.time_s:g}", e.server, e.event])
    return path


def read_cbl_json(path: str | Path, server: str = ANY_SERVER) -> RevocationTrace:
    """Import a Can't Be Late per-tick trace (see the module docstring for how ticks become events).

    Args:
        path: the JSON file (``{"metadata": {"gap_seconds": N}, "data": [v0, v1, ...]}``).
        server: whom the trace's revocations hit (default ``*``: any transient worker).

    Raises:
        DataNotFoundError: no such file.
        DataFormatError: not that format.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataNotFoundError(f"revocation trace not found: {path}")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataFormatError(f"{path}: not valid JSON ({err})") from None
    gap = doc.get("metadata", {}).get("gap_seconds") if isinstance(doc, dict) else None
    data = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0 or not isinstance(data, list):
        raise DataFormatError(f"{path}: expected {{\"metadata\": {{\"gap_seconds\": N > 0}}, "
                              "\"data\": [0/1 per tick]}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in data):
        raise DataFormatError(f"{path}: data must hold one non-negative number per tick (0 = available)")
    events = []
    for tick in range(1, len(data)):
        change = int(round(data[tick])) - int(round(data[tick - 1]))
        kind = "revoke" if change > 0 else "available"
        events += [TraceEvent(tick * float(gap), server, kind)] * abs(change)
    return _check(events, str(path))


def load_revocation_trace(path: str | Path) -> RevocationTrace:
    """A trace file: Can't Be Late JSON (``.json``) or a trace CSV (anything else)."""
    return read_cbl_json(path) if str(path).lower().endswith(".json") else read_trace_csv(path)
