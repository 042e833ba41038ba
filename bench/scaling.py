"""Scaling: cluster steps/s of asynchronous cmdare training with 1, 2, 4 workers and 1, 2 shards.

Each configuration is a real :class:`cmdare.train.Trainer` run on one local Ray instance (synthetic
CIFAR-shaped data, ``--model`` default resnet8, batch 32, 1 CPU per worker and per shard as Ray
resources). Steady-state cluster steps/s comes from the ``StepReport`` callbacks: global steps between
the end of the first ``--skip`` chunks and the last chunk over the time between them (start-up and the
final evaluation excluded). Configurations run in rotated order each round so drift hits all alike.

On this machine all workers and shards share 2 physical cores, so the figures measure how the engine
behaves when CPUs are oversubscribed, not how it scales across servers: with 1 worker + 1 shard the
two processes already alternate on the cores, so more workers can add at most ~2x and then only
compete for the same cores.

Usage: .venv/bin/python bench/scaling.py [--model resnet8] [--steps 150] [--rounds 1]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

WORKERS = (1, 2, 4)
SHARDS = (1, 2)


def run_config(model: str, workers: int, ps: int, steps: int, skip: int) -> dict[str, float]:
    """One Trainer run; steady-state cluster steps/s and worker-side figures."""
    from cmdare.train import Trainer, TrainSpec
    from cmdare.train.callbacks import ShardReport, StepReport, TrainCallback

    class Collect(TrainCallback):
        def __init__(self) -> None:
            self.steps: list[StepReport] = []
            self.shards: list[ShardReport] = []

        def on_step(self, report: StepReport) -> None:
            self.steps.append(report)

        def on_shard(self, report: ShardReport) -> None:
            self.shards.append(report)

    spec = TrainSpec(model=model, dataset="synthetic", workers=workers, ps=ps, steps=steps, batch_size=32,
                     checkpoint_every=0, eval_every=0)
    cb = Collect()
    with tempfile.TemporaryDirectory() as tmp:
        Trainer(spec, [cb], checkpoint_dir=tmp).run()
    reps = cb.steps
    first = skip * workers  # skip the first chunks of every worker
    if len(reps) <= first + 1:
        raise RuntimeError(f"only {len(reps)} chunks reported; raise --steps")
    a, b = reps[first - 1], reps[-1]
    used = reps[first:]
    per_worker = sum(r.steps for r in used) / sum(r.duration_s for r in used)
    stale = [s for r in used for s in r.staleness]
    return {
        "steps_per_s": (b.global_step - a.global_step) / (b.time - a.time),
        "per_worker_steps_per_s": per_worker,
        "comm_share": sum(r.comm_s for r in used) / sum(r.duration_s for r in used),
        "mean_staleness": statistics.fmean(stale) if stale else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--skip", type=int, default=2, help="first chunks per worker excluded from the rate")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were

    import ray

    configs = [(w, s) for w in WORKERS for s in SHARDS]  # 1 and 2 shards side by side in time
    start_local_ray(num_cpus=max(WORKERS) + max(SHARDS))
    t_start = time.perf_counter()
    runs: dict[tuple[int, int], list[dict[str, float]]] = {c: [] for c in configs}
    try:
        for r in range(args.rounds):
            k = (r * 2) % len(configs)
            for w, s in configs[k:] + configs[:k]:
                res = run_config(args.model, w, s, args.steps, args.skip)
                runs[(w, s)].append(res)
                print(f"workers={w} shards={s}", json.dumps({k: round(v, 3) for k, v in res.items()}), flush=True)
    finally:
        ray.shutdown()
    base = statistics.median(x["steps_per_s"] for x in runs[(1, 1)])
    table = []
    for (w, s), xs in runs.items():
        sps = statistics.median(x["steps_per_s"] for x in xs)
        table.append({
            "workers": w, "shards": s,
            "steps_per_s": round(sps, 2),
            "range": [round(min(x["steps_per_s"] for x in xs), 2), round(max(x["steps_per_s"] for x in xs), 2)],
            "speedup_vs_1x1": round(sps / base, 2),
            "per_worker_steps_per_s": round(statistics.median(x["per_worker_steps_per_s"] for x in xs), 2),
            "comm_share": round(statistics.median(x["comm_share"] for x in xs), 3),
            "mean_staleness": round(statistics.median(x["mean_staleness"] for x in xs), 2),
        })
    result = {"benchmark": "scaling", "model": args.model, "dataset": "synthetic 3x32x32", "batch": 32,
              "physical_cores": os.cpu_count(), "rounds": args.rounds, "steps": args.steps,
              "wall_s": round(time.perf_counter() - t_start, 1), "table": table}
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
