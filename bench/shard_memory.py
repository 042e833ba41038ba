"""Shard memory: resident memory of a shard actor's process under steady push_pull, vs the bytes it holds.

Two shard actors (cmdare's real :class:`~cmdare.ps.shard.AsyncShardActor`, subclassed here only to
add a method that reads ``/proc/self/status`` inside the actor process):

* ``baseline``: a shard holding 1,000 parameters after 50 push_pulls (Ray worker + numpy + torch
  imported, the update's code paths run): the cost of an empty shard process.
* ``loaded``: a shard holding ``--mb`` MB of parameters (default 40 MB), under ``--steps`` push_pulls
  from this driver (each a full-size numpy gradient, as a worker sends); RSS sampled every 10 calls.

How it counts: ``VmRSS = RssAnon + RssFile + RssShmem``. ``RssAnon`` is the process's private
memory (parameters, momentum, scratch, Python heap); ``RssShmem`` is Ray object-store pages the
process touched (incoming gradients, outgoing parameters: shared memory owned and bounded by the
object store, counted once per touched page). Reported raw, baseline-subtracted (loaded - baseline),
and as ratios to the parameter bytes. Target (issue 2): at most 3x the parameter bytes. Judged twice,
both baseline-subtracted at the steady-state maximum: the private memory (RssAnon) and the whole
VmRSS including object-store pages (which grow to the store's size; cap it with --object-store-mb).

Usage: .venv/bin/python bench/shard_memory.py [--mb 40] [--steps 150]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from cmdare.ps.shard import AsyncShardActor
from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")


class MeasuredShard(AsyncShardActor):
    """The real async shard plus a read of its own process's memory counters."""

    def memory(self) -> dict[str, int]:
        """``/proc/self/status`` memory fields in bytes, and the process id."""
        out = {"pid": os.getpid()}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in FIELDS:
                    out[key] = int(rest.split()[0]) * 1024
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=40.0, help="parameter bytes the shard holds, in MB")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--object-store-mb", type=int, default=0,
                    help="cap Ray's object store (0: Ray's default, 30%% of memory)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were

    import ray

    from cmdare.ps.blocks import Block
    from cmdare.ps.optimizer import OptimizerConfig
    from cmdare.ps.shard import BlockData

    numel = int(args.mb * 1e6 / 4)
    param_bytes = numel * 4
    cfg = OptimizerConfig(lr=0.01, momentum=0.9, weight_decay=1e-4)
    t_start = time.perf_counter()
    store = {"object_store_memory": args.object_store_mb * 2**20} if args.object_store_mb else {}
    start_local_ray(num_cpus=4, **store)
    try:
        cls = ray.remote(MeasuredShard).options(num_cpus=1)

        def start(n: int):
            shard = cls.remote(0, cfg)
            p = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            ray.get(shard.load.remote(BlockData((Block(0, 0, "w", 0, n),), p, np.zeros_like(p), 0)))
            return shard, (p * 1e-3).astype(np.float32)

        base, g_small = start(1000)
        for _ in range(50):
            ray.get(base.push_pull.remote(g_small))
        baseline = ray.get(base.memory.remote())
        after_load = None
        shard, grad = start(numel)
        after_load = ray.get(shard.memory.remote())
        flat = np.empty(numel, np.float32)
        for _ in range(args.warmup):
            values, _, _ = ray.get(shard.push_pull.remote(grad))
            np.copyto(flat, values)
        samples = []
        t0 = time.perf_counter()
        for i in range(args.steps):
            values, _, _ = ray.get(shard.push_pull.remote(grad))
            np.copyto(flat, values)
            del values
            if i % 10 == 9:
                samples.append(ray.get(shard.memory.remote()))
        step_ms = (time.perf_counter() - t0) / args.steps * 1e3
        baseline_end = ray.get(base.memory.remote())
    finally:
        ray.shutdown()

    def mb(x: float) -> float:
        return round(x / 1e6, 1)

    peak = {k: max(s[k] for s in samples) for k in FIELDS}
    final = samples[-1]
    sub = {k: peak[k] - baseline[k] for k in ("VmRSS", "RssAnon", "RssShmem")}
    result = {
        "benchmark": "shard_memory",
        "param_mb": mb(param_bytes),
        "baseline_mb": {k: mb(baseline[k]) for k in FIELDS},
        "baseline_end_mb": {k: mb(baseline_end[k]) for k in FIELDS},
        "after_load_mb": {k: mb(after_load[k]) for k in FIELDS},
        "steady_peak_mb": {k: mb(peak[k]) for k in FIELDS},
        "steady_final_mb": {k: mb(final[k]) for k in FIELDS},
        "subtracted_mb": {k: mb(v) for k, v in sub.items()},
        "ratio_raw_rss": round(peak["VmRSS"] / param_bytes, 2),
        "ratio_rss_minus_baseline": round(sub["VmRSS"] / param_bytes, 2),
        "ratio_anon_minus_baseline": round(sub["RssAnon"] / param_bytes, 2),
        "ratio_shmem": round(peak["RssShmem"] / param_bytes, 2),
        "target_ratio": 3.0,
        "met": {"private_anon": sub["RssAnon"] / param_bytes <= 3.0,
                "vmrss_incl_object_store_pages": sub["VmRSS"] / param_bytes <= 3.0},
        "push_pull_ms": round(step_ms, 1),
        "steps": args.steps,
        "object_store_mb": args.object_store_mb or "default",
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
