"""Public spot-server preemption traces: one neutral form (spans per server, servers held over time),
lifetimes and capacity gaps.

:func:`read_spot_trace` detects the format from the file's content:

- ``events`` (Bamboo, Parcae): ``ms,add|remove,name`` per line, milliseconds since the cluster was
  requested (Bamboo's simulator and Parcae read it so). A server lives from its add to its remove.
- ``gcp-count`` (Bamboo's GCP logs): ``YYYY-MM-DD, HH:MM:SS, N``: N servers held at that time (seconds
  count from the first line). The count changes at the first line reporting a new value; lines
  repeating the current count may step back in time (the v100 log writes each reading at t, t+60 s and
  t+120 s, and the next reading can come first), but no line may precede the latest change.
- ``cmdare-csv`` (``time_s,server,event``) and ``cbl-json`` (Can't Be Late per-tick JSON): read by
  :func:`cmdare.measure.revocation_traces.load_revocation_trace` and converted by
  :func:`from_revocation_trace`: ``revoke`` lowers the count held, ``available`` raises it, ``notice``
  is ignored (that reader orders a CSV's events itself).

Every trace ends at its last line or event (``horizon_s``): nothing says observation went on longer,
so a server alive then is censored there, not dead.

Assumptions for traces without server identities (count and revocation formats), labelled so because
the files cannot tell: every drop of the count is a preemption (not a deletion by the user); servers
held at the first reading start then (their earlier age is unknown); a drop by n ends n spans in
``order`` (``"fifo"``, the default: the oldest servers; ``"lifo"``: the newest), a rise by n starts n.
Exposure and preemption counts (hence the exponential fit) do not depend on ``order``; lifetime shapes
(a Weibull fit) do. A revocation trace does not say how many servers were held: it is taken as the
fewest that explain it, the most revocations outstanding at once (exact for a one-node CBL trace).
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections import deque
from dataclasses import dataclass
from datetime import date
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cmdare.errors import DataFormatError, DataNotFoundError, UnknownNameError, UserInputError
from cmdare.measure.revocation_traces import load_revocation_trace

__all__ = ["BUNDLED_TRACES", "DATA_DIR", "BundledTrace", "CountSeries", "ServerSpans", "SpotTrace",
           "bundled_traces", "capacity_gaps", "from_revocation_trace", "load_bundled_trace", "read_spot_trace"]

DATA_DIR = Path(__file__).parent / "data" / "spot_traces"
Span = tuple[float, float, bool]  # (start_s, end_s, censored)
ORDERS = ("fifo", "lifo")
MAX_TRACE_BYTES = 256 * 2**20  #: the largest trace file read (the bundled ones are under 60 kB)
_HEADER = "time_s,server,event"
_EVENT_RE = re.compile(r"^(\d+(?:\.\d*)?)\s*,\s*(add|remove)\s*,\s*(\S+)$", re.IGNORECASE)
_COUNT_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})\s*,\s*(\d{1,2}:\d{2}:\d{2})\s*,\s*(-?\d+)$")


@dataclass(frozen=True)
class ServerSpans:
    """Per server, its spans ``(start_s, end_s, censored)``; ``censored``: still alive at ``end_s``.

    ``observed_from_s``: a span that started earlier is left-truncated (only seen from then on; the
    second half of :meth:`split`); its lifetime still counts from its start.
    """

    servers: dict[str, tuple[Span, ...]]
    horizon_s: float
    source: str = ""
    fmt: str = ""
    observed_from_s: float = 0.0

    @classmethod
    def from_arrays(cls, start_s: object, end_s: object, censored: object, horizon_s: float,
                    source: str = "", fmt: str = "arrays") -> ServerSpans:
        """One span per server (``s0``, ``s1``, ...) from equal-length arrays."""
        rows = zip(np.asarray(start_s, float), np.asarray(end_s, float), np.asarray(censored, bool), strict=True)
        return cls({f"s{i}": ((float(s), float(e), bool(c)),) for i, (s, e, c) in enumerate(rows)},
                   float(horizon_s), source, fmt)

    @cached_property
    def _array(self) -> np.ndarray:
        rows = [s for spans in self.servers.values() for s in spans]
        array = np.array(rows, dtype=float).reshape(-1, 3)
        array.flags.writeable = False  # shared by every call of _rows
        return array

    def _rows(self) -> np.ndarray:
        return self._array

    def lifetimes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(seconds from start to end, censored)`` per span."""
        r = self._rows()
        return r[:, 1] - r[:, 0], r[:, 2].astype(bool)

    def entries(self) -> np.ndarray:
        """Age (s) of each span when observation began: > 0 only for left-truncated spans."""
        r = self._rows()
        return np.maximum(self.observed_from_s - r[:, 0], 0.0)

    def exposure_s(self) -> float:
        """Seconds of observed server time (from ``observed_from_s`` for truncated spans)."""
        r = self._rows()
        return float(np.sum(r[:, 1] - np.maximum(r[:, 0], self.observed_from_s)))

    def server_hours(self) -> float:
        """Observed server-hours."""
        return self.exposure_s() / 3600.0

    def preemptions(self) -> int:
        """Spans that ended in a preemption (uncensored ends)."""
        return int(np.sum(~self.lifetimes()[1]))

    @property
    def n_servers(self) -> int:
        """Servers with at least one span."""
        return sum(1 for spans in self.servers.values() if spans)

    def split(self, at_s: float) -> tuple[ServerSpans, ServerSpans]:
        """Halves in time at ``at_s``; every span goes to the half(s) it was observed in.

        First half: spans started before ``at_s``, those still alive then censored at ``at_s``.
        Second half: spans alive after ``at_s`` (or starting at it), kept whole but left-truncated at
        ``at_s`` (observed from ``at_s``: a likelihood conditions on survival to their age then).
        Exposure and preemptions of the halves add up to the whole.
        """
        if not self.observed_from_s < at_s < self.horizon_s:
            raise UserInputError(f"split at {at_s:g} s: not inside ({self.observed_from_s:g}, {self.horizon_s:g}) s")
        first: dict[str, tuple[Span, ...]] = {}
        second: dict[str, tuple[Span, ...]] = {}
        for name, spans in self.servers.items():
            a = tuple((s, min(e, at_s), c or e > at_s) for s, e, c in spans if s < at_s)
            b = tuple((s, e, c) for s, e, c in spans if e > at_s or s >= at_s)
            if a:
                first[name] = a
            if b:
                second[name] = b
        return (ServerSpans(first, float(at_s), self.source, self.fmt, self.observed_from_s),
                ServerSpans(second, self.horizon_s, self.source, self.fmt, float(at_s)))


@dataclass(frozen=True, eq=False)
class CountSeries:
    """Servers held over time: ``counts[i]`` from ``times_s[i]`` until the next change or ``horizon_s``."""

    times_s: np.ndarray
    counts: np.ndarray
    horizon_s: float
    source: str = ""

    def mean_held(self) -> float:
        """Time-weighted mean of the count over ``[times_s[0], horizon_s]``."""
        edges = np.append(self.times_s, self.horizon_s)
        span = edges[-1] - edges[0]
        return float(np.sum(np.diff(edges) * self.counts) / span) if span > 0 else float(self.counts[-1])


@dataclass(frozen=True, eq=False)
class SpotTrace:
    """A trace read by :func:`read_spot_trace`: spans per server and the count of servers held."""

    spans: ServerSpans
    counts: CountSeries


def _series(points: list[tuple[float, int]], horizon_s: float, source: str) -> CountSeries:
    """A count series from ``(time, count after)`` in time order: last count per time, changes only."""
    times: list[float] = []
    counts: list[int] = []
    for t, c in points:
        if times and t == times[-1]:
            counts[-1] = c
        else:
            times.append(t)
            counts.append(c)
    keep = [0] + [i for i in range(1, len(counts)) if counts[i] != counts[i - 1]]
    return CountSeries(np.array(times, float)[keep], np.array(counts, int)[keep], float(horizon_s), source)


def _spans_from_counts(series: CountSeries, fmt: str, order: str) -> ServerSpans:
    """Spans that explain a count series (see the module docstring's assumptions)."""
    if order not in ORDERS:
        raise UnknownNameError("drop order", order, ORDERS)
    live: deque[tuple[str, float]] = deque()  # oldest first: a drop ends from either side in O(1)
    spans: dict[str, list[Span]] = {}
    for t, c in zip(series.times_s.tolist(), series.counts.tolist(), strict=True):
        for _ in range(c - len(live)):
            name = f"s{len(spans) + 1}"
            live.append((name, t))
            spans[name] = []
        for _ in range(len(live) - c):
            name, start = live.popleft() if order == "fifo" else live.pop()
            spans[name].append((start, t, False))
    for name, start in live:
        spans[name].append((start, series.horizon_s, True))
    return ServerSpans({k: tuple(v) for k, v in spans.items()}, series.horizon_s, series.source, fmt)


def _read_events(path: Path, lines: list[tuple[int, str]]) -> SpotTrace:
    live: dict[str, float] = {}
    spans: dict[str, list[Span]] = {}
    points: list[tuple[float, int]] = [(0.0, 0)]
    prev = 0.0
    for n, line in lines:
        m = _EVENT_RE.match(line)
        if not m:
            raise DataFormatError(f"{path} line {n}: expected ms,add|remove,name, got {line[:60]!r}")
        t, verb, name = float(m[1]) / 1000.0, m[2].lower(), m[3]
        if t < prev:
            raise DataFormatError(f"{path} line {n}: times not sorted ({t:g} s after {prev:g} s)")
        prev = t
        if verb == "add":
            if name in live:
                raise DataFormatError(f"{path} line {n}: add of {name}, which is already present")
            live[name] = t
            spans.setdefault(name, [])
        else:
            if name not in live:
                raise DataFormatError(f"{path} line {n}: remove of {name}, which is not present")
            spans[name].append((live.pop(name), t, False))
        points.append((t, len(live)))
    for name, start in live.items():
        spans[name].append((start, prev, True))
    src = str(path)
    return SpotTrace(ServerSpans({k: tuple(v) for k, v in spans.items()}, prev, src, "events"),
                     _series(points, prev, src))


def _read_counts(path: Path, lines: list[tuple[int, str]], order: str) -> SpotTrace:
    t0: float | None = None
    days: dict[str, int] = {}  # date text -> its ordinal (a trace holds few dates: parsed once each)
    points: list[tuple[float, int]] = []
    horizon = last_change = 0.0
    for n, line in lines:
        m = _COUNT_RE.match(line)
        if not m:
            raise DataFormatError(f"{path} line {n}: expected 'YYYY-MM-DD, HH:MM:SS, N', got {line[:60]!r}")
        day = days.get(m[1])
        if day is None:
            try:
                day = days[m[1]] = date.fromisoformat(m[1]).toordinal()
            except ValueError:
                raise DataFormatError(f"{path} line {n}: bad date or time {m[1]} {m[2]}") from None
        hh, mm, ss = (int(v) for v in m[2].split(":"))
        if hh > 23 or mm > 59 or ss > 59:  # what datetime.strptime accepts
            raise DataFormatError(f"{path} line {n}: bad date or time {m[1]} {m[2]}")
        count = int(m[3])
        if count < 0:
            raise DataFormatError(f"{path} line {n}: the count of servers is negative ({count})")
        stamp = day * 86400.0 + hh * 3600 + mm * 60 + ss
        t0 = stamp if t0 is None else t0
        t = stamp - t0
        if t < last_change:
            raise DataFormatError(f"{path} line {n}: times not sorted ({m[2]} precedes the count's last change)")
        horizon = max(horizon, t)
        if not points or count != points[-1][1]:
            points.append((t, count))
            last_change = t
    series = _series(points, horizon, str(path))
    return SpotTrace(_spans_from_counts(series, "gcp-count", order), series)


def from_revocation_trace(trace: Any, fmt: str = "revocations", order: str = "fifo") -> SpotTrace:
    """Spans and counts from a ``RevocationTrace`` (``.events`` in time order, each with ``.time_s`` and
    ``.event``; ``.source``) of :mod:`cmdare.measure.revocation_traces`; see the module's assumptions."""
    level, steps = 0, []
    for e in trace.events:
        if e.event != "notice":
            level += 1 if e.event == "available" else -1
            steps.append((e.time_s, level))
    if not steps:
        raise DataFormatError(f"{trace.source}: no revoke or available events")
    held0 = max(0, -min(lv for _, lv in steps))
    horizon = trace.events[-1].time_s
    series = _series([(0.0, held0)] + [(t, held0 + lv) for t, lv in steps], horizon, trace.source)
    return SpotTrace(_spans_from_counts(series, fmt, order), series)


def _trace_text(path: Path) -> str:
    """The text of a trace file: a regular file (a device or a pipe would never end, or block) of at most
    :data:`MAX_TRACE_BYTES`, read with that bound even if it grows meanwhile."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataNotFoundError(f"spot trace not found: {path}") from None
    except OSError as err:
        raise DataFormatError(f"spot trace {path}: cannot be read ({err.strerror or err})") from None
    if stat.S_ISDIR(st.st_mode):
        raise DataFormatError(f"spot trace {path} is a directory: give a trace file")
    if not stat.S_ISREG(st.st_mode):
        raise DataFormatError(f"spot trace {path} is not a regular file (a device, a pipe or a socket): give a "
                              "trace file")
    too_big = DataFormatError(f"spot trace {path} is larger than {MAX_TRACE_BYTES // 2**20} MiB, more than any "
                              "trace cmdare fits (about 10 million lines)")
    if st.st_size > MAX_TRACE_BYTES:
        raise too_big
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except OSError as err:
        raise DataFormatError(f"spot trace {path}: cannot be read ({err.strerror or err})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise too_big
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise DataFormatError(f"{path}: not a text file") from None


def read_spot_trace(path: str | Path, order: str = "fifo") -> SpotTrace:
    """Read a spot trace in any format of the module docstring (detected from its first line).

    Args:
        path: the trace file.
        order: which servers a drop of a count ends, ``"fifo"`` (oldest) or ``"lifo"`` (newest); an
            assumption, used only where the trace has no server identities.

    Raises:
        DataNotFoundError: no such file.
        DataFormatError: not a regular file (``/dev/zero``, a pipe), larger than :data:`MAX_TRACE_BYTES`, not
            text, empty, no events, unsorted, unknown format, a negative count, a remove of a server not present
            (one line naming the file and line).
    """
    path = Path(path).expanduser()
    text = _trace_text(path).splitlines()
    lines = [(n, s.strip()) for n, s in enumerate(text, 1) if s.strip() and not s.lstrip().startswith("#")]
    if not lines:
        raise DataFormatError(f"{path}: empty file, no trace lines")
    n, first = lines[0]
    fmt = "cbl-json" if first.startswith("{") else "cmdare-csv" if first.replace(" ", "").lower() == _HEADER else ""
    if fmt:
        return from_revocation_trace(load_revocation_trace(path), fmt, order)
    if _EVENT_RE.match(first):
        return _read_events(path, lines)
    if _COUNT_RE.match(first):
        return _read_counts(path, lines, order)
    raise DataFormatError(f"{path} line {n}: unknown spot trace format {first[:40]!r}; expected ms,add|remove,name, "
                          "'YYYY-MM-DD, HH:MM:SS, N', time_s,server,event or Can't Be Late JSON")


def capacity_gaps(trace: SpotTrace | CountSeries) -> tuple[np.ndarray, np.ndarray]:
    """Per server lost, seconds until the count recovers to its level before that loss.

    A drop from L to L - n loses the servers at levels L, L - 1, ..., L - n + 1; the one at level k is
    back when the count next reaches k. Returns ``(gaps_s, censored)`` in the order of the losses (by time, then
    level): a loss never made good ends at the horizon, censored. Losses are drops of the count series, so a remove
    and an add at the same instant of an event trace cancel out.

    One pass, linear in the changes and the losses: every level still lost lies above the count, and a later drop
    loses only levels below the earlier ones, so a rise makes good the lowest lost levels first (a stack).
    """
    cs = trace.counts if isinstance(trace, SpotTrace) else trace
    t, c = cs.times_s.tolist(), [int(v) for v in cs.counts.tolist()]
    lost_at: list[float] = []  # per loss, when it happened
    back_at: list[float] = []  # per loss, when its level came back (the horizon until then)
    waiting: list[tuple[int, int]] = []  # (level, loss index), the lowest level on top
    for i in range(1, len(c)):
        if c[i] < c[i - 1]:
            n, first = c[i - 1] - c[i], len(lost_at)  # losses first .. first + n - 1: levels c[i] + 1 .. c[i - 1]
            lost_at += [t[i]] * n
            back_at += [math.inf] * n
            waiting.extend((c[i] + 1 + k, first + k) for k in reversed(range(n)))
        else:
            while waiting and waiting[-1][0] <= c[i]:
                back_at[waiting.pop()[1]] = t[i]
    back = np.array(back_at, float)
    censored = np.isinf(back)
    back[censored] = cs.horizon_s
    return back - np.array(lost_at, float), censored


class BundledTrace(NamedTuple):
    """A shipped trace: its file, the offering it covers and where it comes from (see CREDITS.md)."""

    file: str
    cloud: str
    gpu: str
    region: str | None
    offering: str
    citation: str


_BAMBOO = ("Thorpe et al., Bamboo: Making Preemptible Instances Resilient for Affordable Training of Large DNNs, "
           "NSDI 2023; github.com/uclasystem/bamboo")
_PARCAE = ("Duan et al., Parcae: Proactive, Liveput-Optimized DNN Training on Preemptible Instances, NSDI 2024; "
           "github.com/JF-D/Parcae")

BUNDLED_TRACES: dict[str, BundledTrace] = {
    "aws:v100": BundledTrace("bamboo_p3-trace.csv", "aws", "v100", None, "AWS p3.2xlarge spot (1x V100), Dec 2021",
                             f"{_BAMBOO}, traces/p3-trace.csv"),
    "aws:t4": BundledTrace("bamboo_g4dn-trace.csv", "aws", "t4", None, "AWS g4dn spot (T4), Dec 2021",
                           f"{_BAMBOO}, traces/g4dn-trace.csv"),
    "gcp:a100:us-east1": BundledTrace("bamboo_gcloud_a100x1-east1b.txt", "gcp", "a100", "us-east1",
                                      "GCP a100x1, zone us-east1-b, 2021-12-11/12",
                                      f"{_BAMBOO}, traces/gcloud/a100x1-east1b.txt"),
    "gcp:v100:us-east1": BundledTrace("bamboo_gcloud_v100x1-east1c.txt", "gcp", "v100", "us-east1",
                                      "GCP v100x1, zone us-east1-c, 2021-12-10/11",
                                      f"{_BAMBOO}, traces/gcloud/v100x1-east1c.txt"),
    "aws:v100:parcae": BundledTrace("parcae_p3trace.csv", "aws", "v100", None,
                                    "AWS p3.2xlarge spot (1x V100); the same events as aws:v100",
                                    f"{_PARCAE}, liveput/traces/p3trace.csv"),
}


def bundled_traces() -> dict[str, Path]:
    """The shipped traces by key (``aws:v100``, ``aws:t4``, ``gcp:a100:us-east1``, ...)."""
    return {key: DATA_DIR / info.file for key, info in BUNDLED_TRACES.items()}


def load_bundled_trace(key: str, order: str = "fifo") -> SpotTrace:
    """Read a shipped trace by key (:func:`bundled_traces`)."""
    if key not in BUNDLED_TRACES:
        raise UnknownNameError("bundled spot trace", key, BUNDLED_TRACES)
    return read_spot_trace(DATA_DIR / BUNDLED_TRACES[key].file, order)
