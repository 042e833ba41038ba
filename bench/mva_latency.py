"""Latency of the cluster-speed queueing model on a large cluster (exact MVA vs Schweitzer's approximation).

``mva_throughput`` on 3 classes x 100 workers (the large-cluster case, which switches to the
approximation). Target: under 0.5 s per call (was a timed assert in tests/predict/test_predict_api.py,
which keeps the result check). The exact MVA on a smaller population is timed beside it.

Usage: .venv/bin/python bench/mva_latency.py [--reps 20]
The last line printed is one JSON object with the figures (median, min, max over reps; load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from cmdare.predict.cluster_speed import mva_throughput  # noqa: E402

LARGE = ([0.2, 0.08, 0.05], [100, 100, 100], 0.01)
EXACT = ([0.03, 0.1], [30, 30], 0.0096)


def _time(args: tuple, reps: int) -> tuple[list[float], float]:
    mva_throughput(*args)  # warm: imports and first-call set-up are not per query
    times, value = [], 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        value = mva_throughput(*args)
        times.append(time.perf_counter() - t0)
    return times, value


def _figures(times: list[float], value: float, target_s: float | None) -> dict[str, object]:
    out: dict[str, object] = {"median_ms": round(1e3 * statistics.median(times), 3),
                              "min_ms": round(1e3 * min(times), 3), "max_ms": round(1e3 * max(times), 3),
                              "steps_per_s": round(value, 4)}
    if target_s is not None:
        out["target_ms"] = 1e3 * target_s
        out["max_within_target"] = max(times) <= target_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    out: dict[str, object] = {"bench": "mva_latency", "reps": args.reps}
    out["large_3x100"] = _figures(*_time(LARGE, args.reps), 0.5)
    out["exact_2x30"] = _figures(*_time(EXACT, args.reps), None)
    out["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
