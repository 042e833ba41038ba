"""Benchmark: `cmdare models fit lifetimes` against the length of the trace (issue 42: 1e5 lines took 3.2 s, 3e5
17.7 s, 1e6 245 s: the capacity gaps scanned every later change for each server lost).

Writes synthetic traces in the Bamboo/Parcae event format (``ms,add|remove,name``: servers added and preempted at
random, 5 to 200 held) and the GCP count format, then times reading, the capacity gaps and the whole fit
(:func:`cmdare.measure.spot_fits.fit_offering`, as the command runs it, without saving). Time per line should stay
about flat as the trace grows.

Usage: python bench/spot_fit_scaling.py [--lines 100000,300000,1000000] [--formats events,counts]
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import tempfile
import time
from pathlib import Path


def _events(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    live: list[str] = []
    t = k = 0
    with path.open("w") as f:
        for _ in range(n):
            t += rng.randint(0, 60_000)
            if len(live) < 5 or (rng.random() < 0.5 and len(live) < 200):
                k += 1
                live.append(f"node{k}")
                f.write(f"{t},add,node{k}\n")
            else:
                f.write(f"{t},remove,{live.pop(rng.randrange(len(live)))}\n")


def _counts(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    t, c = datetime.datetime(2021, 1, 1), 50
    with path.open("w") as f:
        for _ in range(n):
            t += datetime.timedelta(seconds=rng.randint(1, 120))
            c = max(0, min(100, c + rng.choice((-2, -1, 0, 0, 1, 2))))
            f.write(f"{t:%Y-%m-%d}, {t:%H:%M:%S}, {c}\n")


def bench(lines: list[int], formats: list[str]) -> dict[str, object]:
    from cmdare.measure.spot_fits import fit_offering
    from cmdare.measure.spot_traces import capacity_gaps, read_spot_trace

    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in formats:
            for n in lines:
                path = Path(tmp) / f"{fmt}-{n}.txt"
                (_events if fmt == "events" else _counts)(path, n)
                t0 = time.perf_counter()
                trace = read_spot_trace(path)
                t1 = time.perf_counter()
                capacity_gaps(trace)
                t2 = time.perf_counter()
                fit_offering([path], "aws:v100", "2026-01-01")
                t3 = time.perf_counter()
                out[f"{fmt}_{n}"] = {"read_s": round(t1 - t0, 2), "capacity_s": round(t2 - t1, 3),
                                     "fit_s": round(t3 - t2, 2), "fit_us_per_line": round((t3 - t2) / n * 1e6, 1)}
                print(fmt, n, json.dumps(out[f"{fmt}_{n}"]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", default="100000,300000,1000000")
    parser.add_argument("--formats", default="events,counts")
    args = parser.parse_args()
    load0 = os.getloadavg()[0]
    figures = bench([int(float(v)) for v in args.lines.split(",")], args.formats.split(","))
    print(json.dumps({**figures, "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
