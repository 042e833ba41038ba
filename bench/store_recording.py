"""Benchmark: recording through the store recorder.

1. 100,000 step metrics through :class:`StoreRecorder` (batch 200) into SQLite and, when
   ``CMDARE_BENCH_PG_URL`` or ``CMDARE_TEST_PG_URL`` is set, PostgreSQL: rows/s and microseconds per hook
   call, against a no-op callback measured in the same run.
2. A real training run (``cmdare.train``, digits, 2 workers, 1 PS) with and without the recorder,
   interleaved: steps/s of each, and the time spent inside the recorder's hooks as a share of the run's
   wall time (the direct overhead; run-to-run noise on a shared 2-core machine is larger than 2%).

Usage: python bench/store_recording.py [--rows N] [--train-steps N] [--pairs N] [--no-train]
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.store import open_store
from cmdare.train.callbacks import RunInfo, StepReport, TrainCallback
from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1


def _reports(n: int) -> list[StepReport]:
    t0 = time.time()
    return [
        StepReport("bench-run", t0 + i * 0.01, i * 10, i % 8, 10, 0.5, 1.0 / (i + 1), 20.0, 0.3, 0.2, (0, 1, 1, 2))
        for i in range(n)
    ]


def record_rows(url: str, n: int) -> dict[str, float]:
    """Push n step reports through a StoreRecorder; rows/s including the final flush."""
    reports = _reports(n)
    noop = TrainCallback()
    t = time.perf_counter()
    for r in reports:
        noop.on_step(r)
    noop_s = time.perf_counter() - t
    store = open_store(url)
    rec = StoreRecorder(store, batch_size=200)
    rec.on_run_start(RunInfo("bench-run", {"bench": True}, time.time()))
    t = time.perf_counter()
    for r in reports:
        rec.on_step(r)
    rec.close()
    rec_s = time.perf_counter() - t
    assert store.count("step_metrics") == n, "rows lost"
    store.close()
    return {
        "rows": n,
        "seconds": rec_s,
        "rows_per_s": n / rec_s,
        "us_per_step": 1e6 * rec_s / n,
        "noop_us_per_step": 1e6 * noop_s / n,
    }


class _Timed(TrainCallback):
    """Wraps a callback and accumulates the time spent in its hooks."""

    def __init__(self, inner: TrainCallback):
        self.inner, self.spent_s, self.calls = inner, 0.0, 0
        for hook in ("on_run_start", "on_step", "on_shard", "on_eval", "on_checkpoint", "on_event", "on_run_end"):
            setattr(self, hook, self._wrap(getattr(inner, hook)))

    def _wrap(self, fn):
        def call(report):
            t = time.perf_counter()
            fn(report)
            self.spent_s += time.perf_counter() - t
            self.calls += 1

        return call


def train_pairs(url: str, steps: int, pairs: int) -> dict[str, float]:
    import ray

    from cmdare.train import TrainSpec, train

    # One private local Ray for all runs ("local": never join another user's cluster on this machine).
    if not ray.is_initialized():
        start_local_ray(num_cpus=max(4, os.cpu_count() or 1))
    spec = TrainSpec(model="resnet15", dataset="digits", workers=2, ps=1, steps=steps, eval_every=0, checkpoint_every=0)
    with_speed, without_speed, shares = [], [], []
    for _ in range(pairs):
        base = train(spec, [])
        without_speed.append(base.steps_per_s)
        timed = _Timed(StoreRecorder(url))
        rec = train(spec, [timed])
        timed.inner.close()
        with_speed.append(rec.steps_per_s)
        shares.append(timed.spent_s / rec.wall_s)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "steps": steps,
        "pairs": pairs,
        "steps_per_s_without": mean(without_speed),
        "steps_per_s_with": mean(with_speed),
        "slowdown": 1 - mean(with_speed) / mean(without_speed),
        "recorder_time_share": max(shares),
        "runs_without": without_speed,
        "runs_with": with_speed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--train-steps", type=int, default=400)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--no-train", action="store_true")
    args = ap.parse_args()
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        out["sqlite"] = record_rows(sqlite_url, args.rows)
        print("sqlite", json.dumps(out["sqlite"]))
        pg = os.environ.get("CMDARE_BENCH_PG_URL") or os.environ.get("CMDARE_TEST_PG_URL")
        if pg:
            from sqlalchemy import create_engine, text
            from sqlalchemy.engine import make_url

            base = make_url(pg)
            name = f"cmdare_bench_{os.getpid()}"
            admin = create_engine(base, isolation_level="AUTOCOMMIT")
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            try:
                out["postgresql"] = record_rows(base.set(database=name).render_as_string(False), args.rows)
                print("postgresql", json.dumps(out["postgresql"]))
            finally:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if not args.no_train:
            out["training"] = train_pairs(f"sqlite:///{Path(tmp) / 'train.db'}", args.train_steps, args.pairs)
            print("training", json.dumps(out["training"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
