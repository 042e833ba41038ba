"""``cmdare models fit lifetimes`` on large and wrong input (issue 42, item 11): it grew faster than its input (1e6
lines: 245 s), accepted and saved offerings the catalog does not have, said ``split at 0 s: not inside (0, 0) s``
for a trace whose events are all at 0 and ``spot trace not found`` for ``/dev/zero``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cli_inprocess import run_cmdare
from cmdare.measure.spot_traces import (
    DATA_DIR,
    MAX_TRACE_BYTES,
    CountSeries,
    _spans_from_counts,
    capacity_gaps,
)

P3 = DATA_DIR / "bamboo_p3-trace.csv"


def _gaps_by_definition(cs: CountSeries) -> tuple[np.ndarray, np.ndarray]:
    """The definition, loss by loss: the server lost at level k is back when the count next reaches k."""
    t, c = cs.times_s, cs.counts
    gaps, censored = [], []
    for i in range(1, c.size):
        for level in range(int(c[i]) + 1, int(c[i - 1]) + 1):
            later = [j for j in range(i + 1, c.size) if c[j] >= level]
            gaps.append((t[later[0]] if later else cs.horizon_s) - t[i])
            censored.append(not later)
    return np.array(gaps, float), np.array(censored, bool)


@pytest.mark.parametrize("seed", range(8))
def test_capacity_gaps_are_the_definitions(seed):
    rng = np.random.default_rng(seed)
    counts = np.maximum(0, 20 + np.cumsum(rng.integers(-4, 5, size=300)))
    times = np.cumsum(rng.uniform(0, 100, size=counts.size))
    cs = CountSeries(times, counts, float(times[-1] + 50))
    gaps, censored = capacity_gaps(cs)
    want_gaps, want_censored = _gaps_by_definition(cs)
    np.testing.assert_allclose(gaps, want_gaps)
    np.testing.assert_array_equal(censored, want_censored)


def test_a_long_trace_is_read_in_one_pass():
    """A million changes of the count, and a drop of 200,000 servers at once: the former scan of every later
    change per loss (500,000 x 1,000,000 comparisons) and the list's pop from its front (200,000 x 200,000 moves)
    would take minutes here; one pass takes about a second."""
    n = 1_000_000
    counts = np.where(np.arange(n) % 2 == 0, 50, 49)  # 50, 49, 50, ...: each server lost is back 10 s later
    counts = np.append(counts, [200_000, 0])  # then 200,000 servers that all end at once, never replaced
    times = np.arange(counts.size) * 10.0
    cs = CountSeries(times, counts, float(times[-1] + 10))
    gaps, censored = capacity_gaps(cs)
    assert gaps.size == n // 2 + 200_000
    assert np.all(gaps[: n // 2] == 10.0) and not censored[: n // 2].any()
    assert np.all(gaps[n // 2:] == 10.0) and censored[n // 2:].all()  # lost at the last change, to the horizon
    spans = _spans_from_counts(cs, "gcp-count", "fifo")
    lifetimes, cens = spans.lifetimes()
    # the first 50, one more per rise to 50 and 199,951 at the rise to 200,000; each ends in a drop
    assert lifetimes.size == 50 + (n // 2 - 1) + 199_951 and not cens.any()


def _fit(tmp_path, trace: Path | str, offering: str = "aws:v100") -> tuple[int, str, str]:
    return run_cmdare(tmp_path / "home", "models", "fit", "lifetimes", "--trace", str(trace), "--offering", offering)


@pytest.mark.parametrize(("offering", "message"), [
    ("aws:zz9", "unknown GPU type 'zz9'; valid: K80, P100, V100"),
    ("aws:v100:nowhere-1", "V100 servers on aws are not offered in 'nowhere-1'; offered in: eu-west-1, us-east-1"),
    ("aws:p100", "P100 servers are not offered in 'aws'; offered in: gcp"),
])
def test_an_offering_the_catalog_lacks_is_refused_and_nothing_saved(tmp_path, offering, message):
    code, out, err = _fit(tmp_path, P3, offering)
    lines = err.strip().splitlines()
    assert code == 1 and out == "" and len(lines) == 1 and lines[0].startswith(f"error: {message}"), err
    assert not list((tmp_path / "home").rglob("*.json"))


def test_bad_trace_files_get_their_own_one_line_message(tmp_path):
    zero = tmp_path / "zero.csv"
    zero.write_text("0,add,n1\n0,add,n2\n0,remove,n1\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer for ever
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as f:
        f.truncate(MAX_TRACE_BYTES + 1)  # sparse: no disk used
    for path, message in [(zero, "every event is at 0 s: the trace spans no time"),
                          ("/dev/zero", "spot trace /dev/zero is not a regular file"),
                          (fifo, "is not a regular file"), (tmp_path, "is a directory"),
                          (huge, "is larger than 256 MiB")]:
        code, out, err = _fit(tmp_path, path)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (path, err)
