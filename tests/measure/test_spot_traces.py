"""Spot traces: the bundled public traces parse to the counts read off the files by hand, censoring and
the time split are right, capacity gaps, the revocation formats, and every bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cmdare.errors import DataFormatError, DataNotFoundError, UnknownNameError, UserInputError
from cmdare.measure.spot_traces import (
    BUNDLED_TRACES,
    DATA_DIR,
    ServerSpans,
    bundled_traces,
    capacity_gaps,
    load_bundled_trace,
    read_spot_trace,
)

# Per bundled trace, read off the files (grep/awk): servers, preemptions, still alive at the end,
# horizon (s) and server-hours; the GCP counts go 55 -> 64 (154 drops, 163 rises) and 80 -> 80 (518 each).
EXPECTED = {
    "aws:v100": ("events", 177, 167, 10, 40_920.0, 273.1167),
    "aws:t4": ("events", 79, 74, 5, 38_760.0, 135.6833),
    "aws:v100:parcae": ("events", 177, 167, 10, 40_920.0, 273.1167),
    "gcp:a100:us-east1": ("gcp-count", 55 + 163, 154, 64, 27 * 3600 + 66.0, None),
    "gcp:v100:us-east1": ("gcp-count", 80 + 518, 518, 80, 24 * 3600 + 613.0, None),
}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_bundled_traces_parse_to_the_hand_counts(key):
    fmt, servers, preempted, alive, horizon, hours = EXPECTED[key]
    trace = load_bundled_trace(key)
    s = trace.spans
    assert (s.fmt, s.n_servers, s.preemptions(), s.horizon_s) == (fmt, servers, preempted, horizon)
    t, censored = s.lifetimes()
    assert int(censored.sum()) == alive == trace.counts.counts[-1]
    assert np.all(t >= 0) and np.all(t <= horizon)
    # server-hours are the area under the count of servers held
    edges = np.append(trace.counts.times_s, trace.counts.horizon_s)
    assert s.server_hours() == pytest.approx(np.sum(np.diff(edges) * trace.counts.counts) / 3600)
    if hours is not None:
        assert s.server_hours() == pytest.approx(hours, abs=1e-3)
    gaps, gap_censored = capacity_gaps(trace)
    assert gaps.size == int(np.sum(np.maximum(-np.diff(trace.counts.counts), 0))) and np.all(gaps >= 0)


def test_bundled_index_and_sources():
    paths = bundled_traces()
    assert set(paths) == set(BUNDLED_TRACES) == {"aws:v100", "aws:t4", "gcp:a100:us-east1", "gcp:v100:us-east1",
                                                 "aws:v100:parcae"}
    assert all(p.is_file() and p.parent == DATA_DIR for p in paths.values())
    assert BUNDLED_TRACES["gcp:a100:us-east1"][1:4] == ("gcp", "a100", "us-east1")
    assert BUNDLED_TRACES["aws:t4"][1:4] == ("aws", "t4", None)
    assert all("github.com/" in info.citation for info in BUNDLED_TRACES.values())
    credits = (DATA_DIR / "CREDITS.md").read_text()
    assert all(info.file in credits for info in BUNDLED_TRACES.values()) and credits.count("MIT License") >= 2
    assert sum(p.stat().st_size for p in DATA_DIR.iterdir()) < 2_000_000
    # Parcae ships Bamboo's p3 trace (LF instead of CRLF line ends): the same spans
    a, b = load_bundled_trace("aws:v100").spans, load_bundled_trace("aws:v100:parcae").spans
    assert a.servers == b.servers
    with pytest.raises(UnknownNameError):
        load_bundled_trace("aws:k80")


def test_event_trace_spans_and_censoring():
    s = load_bundled_trace("aws:v100").spans
    assert s.servers["node1"] == ((0.0, 3060.0, False),)  # 0,add,node1 ... 3060000,remove,node1
    assert s.servers["node135"] == ((23_940.0, 40_920.0, True),)  # added, never removed: alive at the end
    assert s.lifetimes()[0].min() == 120.0


def test_time_split_partitions_exposure_and_preemptions():
    s = load_bundled_trace("aws:v100").spans
    first, second = s.split(20_000.0)
    assert first.horizon_s == 20_000.0 and second.observed_from_s == 20_000.0
    assert first.server_hours() + second.server_hours() == pytest.approx(s.server_hours())
    assert first.preemptions() + second.preemptions() == s.preemptions()
    assert s.servers["node1"] == first.servers["node1"] and "node1" not in second.servers
    t1, c1 = first.lifetimes()
    assert np.all(t1 <= 20_000.0)
    # a server alive across the split: censored at it in the first half, left-truncated in the second
    crossing = [n for n, sp in s.servers.items() if sp[0][0] < 20_000.0 < sp[0][1]]
    assert crossing
    name = crossing[0]
    (start, end, cens), = s.servers[name]
    assert first.servers[name] == ((start, 20_000.0, True),) and second.servers[name] == ((start, end, cens),)
    entries = second.entries()
    assert np.count_nonzero(entries) == len(crossing) and entries.max() <= 20_000.0
    with pytest.raises(UserInputError):
        s.split(s.horizon_s)


def test_from_arrays():
    s = ServerSpans.from_arrays([0, 10], [5, 20], [False, True], horizon_s=20)
    assert s.servers == {"s0": ((0.0, 5.0, False),), "s1": ((10.0, 20.0, True),)}
    assert s.preemptions() == 1 and s.exposure_s() == 15.0


def test_capacity_gaps_by_hand(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("0,add,a\n0,add,b\n0,add,c\n1000,remove,a\n2000,remove,b\n5000,add,d\n9000,add,e\n"
                    "10000,remove,c\n12000,remove,d\n")
    trace = read_spot_trace(path)
    assert trace.counts.times_s.tolist() == [0, 1, 2, 5, 9, 10, 12] and trace.counts.counts.tolist() == [
        3, 2, 1, 2, 3, 2, 1]
    gaps, censored = capacity_gaps(trace)
    # a (level 3) back at 9 s, b (level 2) back at 5 s; c and d lost for good at 10 s and 12 s (the horizon)
    assert gaps.tolist() == [8.0, 3.0, 2.0, 0.0] and censored.tolist() == [False, False, True, True]
    assert trace.spans.servers["e"] == ((9.0, 12.0, True),)


def test_count_trace_spans_fifo_and_lifo(tmp_path):
    path = tmp_path / "gcp.txt"
    path.write_text("2021-12-10, 00:00:00, 4\n2021-12-10, 00:01:00, 1\n2021-12-10, 00:03:00, 3\n"
                    "2021-12-10, 00:05:00, 3\n2021-12-10, 00:04:00, 3\n"  # a repeated count may step back
                    "2021-12-10, 00:10:00, 4\n")
    fifo = read_spot_trace(path)
    assert fifo.spans.fmt == "gcp-count" and fifo.spans.horizon_s == 600.0
    assert fifo.spans.servers == {
        "s1": ((0.0, 60.0, False),), "s2": ((0.0, 60.0, False),), "s3": ((0.0, 60.0, False),),
        "s4": ((0.0, 600.0, True),), "s5": ((180.0, 600.0, True),), "s6": ((180.0, 600.0, True),),
        "s7": ((600.0, 600.0, True),)}
    lifo = read_spot_trace(path, order="lifo").spans
    assert lifo.servers["s1"] == ((0.0, 600.0, True),) and lifo.servers["s4"] == ((0.0, 60.0, False),)
    assert lifo.server_hours() == fifo.spans.server_hours() and lifo.preemptions() == 3
    gaps, censored = capacity_gaps(fifo)
    assert gaps.tolist() == [120.0, 120.0, 540.0] and not censored.any()
    with pytest.raises(UnknownNameError):
        read_spot_trace(path, order="random")


def test_cmdare_and_cbl_revocation_traces(tmp_path):
    csv = tmp_path / "trace.csv"
    csv.write_text("time_s,server,event\n100,0,revoke\n150,*,notice\n200,*,revoke\n300,*,available\n")
    trace = read_spot_trace(csv)
    # two revocations outstanding at once: two servers held at the start, one back at 300 s
    assert trace.counts.counts.tolist() == [2, 1, 0, 1] and trace.spans.fmt == "cmdare-csv"
    assert trace.spans.servers == {"s1": ((0.0, 100.0, False),), "s2": ((0.0, 200.0, False),),
                                   "s3": ((300.0, 300.0, True),)}
    cbl = tmp_path / "trace.json"
    cbl.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 0, 1, 1, 0, 0, 1, 0]}))
    trace = read_spot_trace(cbl)
    assert trace.spans.fmt == "cbl-json" and trace.spans.preemptions() == 2
    assert [sp[0] for sp in trace.spans.servers.values()] == [(0.0, 1200.0, False), (2400.0, 3600.0, False),
                                                             (4200.0, 4200.0, True)]
    assert capacity_gaps(trace)[0].tolist() == [1200.0, 600.0]


BAD = {
    "empty": ("", "empty"),
    "blank": ("\n  \n# only a comment\n", "empty"),
    "unsorted": ("2000,add,a\n1000,add,b\n", "line 2: times not sorted"),
    "unsorted_count": ("2021-12-10, 13:00:00, 5\n2021-12-10, 13:05:00, 4\n2021-12-10, 13:03:00, 4\n",
                       "line 3: times not sorted"),
    "unknown": ("hello,world\n", "line 1: unknown spot trace format"),
    "negative": ("2021-12-10, 13:00:00, 5\n2021-12-10, 13:01:00, -1\n", "line 2: the count of servers is negative"),
    "unknown_server": ("0,add,a\n1000,remove,b\n", "line 2: remove of b, which is not present"),
    "double_add": ("0,add,a\n1000,add,a\n", "line 2: add of a"),
    "bad_line": ("0,add,a\n1000,remove\n", "line 2: expected ms,add|remove,name"),
    "no_events": ("time_s,server,event\n", "no revoke events"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_naming_the_file(tmp_path, case):
    text, message = BAD[case]
    path = tmp_path / f"{case}.trace"
    path.write_text(text)
    with pytest.raises(DataFormatError) as err:
        read_spot_trace(path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(DataNotFoundError, match="nope.csv"):
        read_spot_trace(tmp_path / "nope.csv")
