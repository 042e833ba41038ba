"""Revocation traces: the CSV format, the Can't Be Late importer, and the trace source both drivers run."""

from __future__ import annotations

import json

import pytest

from cmdare.cloud.servers import ServerSpec
from cmdare.control import RevocationPlan, TraceRevocations, WorkerInfo, build_revocation_source
from cmdare.errors import DataFormatError, UserInputError
from cmdare.measure.revocation_traces import (
    RevocationTrace,
    TraceEvent,
    load_revocation_trace,
    read_cbl_json,
    read_trace_csv,
    write_trace_csv,
)

CSV = ("time_s,server,event\n# a comment\n3600,0,revoke\n5400,K80,notice\n5430,k80,revoke\n9000,*,revoke\n"
       "9100,*,available\n")


def _worker(wid: int, slot: int, gpu: str = "K80", transient: bool = True) -> WorkerInfo:
    return WorkerInfo(wid, slot, ServerSpec(gpu, "gcp", "us-east1", transient, 0.3), 0.0, trained_at=0.0)


def test_csv_reads_every_event_and_round_trips(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    trace = read_trace_csv(path)
    assert [e.event for e in trace.events] == ["revoke", "notice", "revoke", "revoke", "available"]
    assert trace.schedule() == ((3600.0, 0), (5430.0, "k80"), (9000.0, None))
    assert trace.times("notice") == [5400.0] and trace.times("available") == [9100.0]
    again = read_trace_csv(write_trace_csv(trace, tmp_path / "again.csv"))
    assert again.events == trace.events


@pytest.mark.parametrize(("text", "needle"), [
    ("when,server,event\n1,0,revoke\n", "header"),
    ("time_s,server,event\nsoon,0,revoke\n", "line 2: time_s 'soon'"),
    ("time_s,server,event\n5,0,explode\n", "event 'explode'"),
    ("time_s,server,event\n-5,0,revoke\n", ">= 0"),
    ("time_s,server,event\n5,0,notice\n", "no revoke events"),
])
def test_bad_csv_names_the_problem(tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=needle):
        read_trace_csv(path)


def test_cant_be_late_ticks_become_events(tmp_path):
    # one-node trace, 1 = preempted (the study's simulator: spot_available() = not trace[tick])
    path = tmp_path / "us-east-1c_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 0, 1, 1, 0, 0, 0, 1, 0]}))
    trace = load_revocation_trace(path)
    assert trace.times("revoke") == [600.0, 2100.0] and trace.times("available") == [1200.0, 2400.0]
    assert {e.server for e in trace.events} == {"*"}
    # a multi-node trace: the value is the number of preempted instances, a rise by 2 is two revocations
    multi = tmp_path / "4node.json"
    multi.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 2, 1, 3]}))
    assert read_cbl_json(multi, server="v100").schedule() == ((60.0, "v100"), (60.0, "v100"), (180.0, "v100"),
                                                              (180.0, "v100"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [0, 1]}))
    with pytest.raises(DataFormatError, match="gap_seconds"):
        read_cbl_json(bad)


def test_trace_file_in_a_revocations_spec(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    plan = RevocationPlan.parse(f"trace={path},speedup=100")
    assert plan.source == "trace" and plan.trace == ((3600.0, 0), (5430.0, "k80"), (9000.0, None))
    source = build_revocation_source(plan)
    assert isinstance(source, TraceRevocations) and source.next_due(10.0) == 10.0 + 36.0  # compressed 100x
    assert RevocationPlan.parse("trace=3@0+6.5@1").trace == ((3.0, 0), (6.5, 1))  # the scripted schedule stays
    with pytest.raises(UserInputError, match="no such trace file"):
        RevocationPlan.parse(f"trace={tmp_path / 'missing.csv'}")


def test_targets_slot_type_and_any():
    live = [_worker(10, 0), _worker(11, 1, "V100"), _worker(12, 2, "V100"), _worker(13, 3, "K80", transient=False)]
    source = TraceRevocations([(1.0, "v100"), (2.0, None), (3.0, 3), (4.0, "p100")], speedup=2.0)
    assert source.due(0.4, 0.0, live) == [] and source.next_due(0.0) == 0.5
    assert source.due(0.5, 0.0, live) == [11]  # the lowest live V100 slot
    assert source.due(1.0, 0.0, live[1:]) == [11]  # any transient worker: the lowest live slot
    assert source.due(1.5, 0.0, live) == [13]  # a slot is hit whatever its pricing (as the scripted schedule)
    assert source.due(9.0, 0.0, live) == [] and source.next_due(0.0) is None  # no P100 live: skipped
    two = TraceRevocations([(1.0, None), (1.0, None)])
    assert two.due(1.0, 0.0, live) == [10, 11]  # two revocations at one tick hit two workers


def test_trace_dataclasses():
    trace = RevocationTrace((TraceEvent(1.0, "3", "revoke"), TraceEvent(2.0, "", "revoke")))
    assert trace.schedule() == ((1.0, 3), (2.0, None))
