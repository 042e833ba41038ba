"""PSLD on the real engine: steps/s against static placements under a 3x straggler shard, shard load
balance before and after balancing, PSLD's cost without a straggler, and elastic shards from one.

Every configuration is a real :class:`cmdare.train.Trainer` run on one local Ray instance: asynchronous
training of ``resnet8_fc`` (ResNet-8 trunk + a 4,096x1,024 fully connected layer: one 16 MiB tensor
among small ones) on digits, same seed for every run. Steady-state steps/s is measured over the second
half of each run (global steps between the first chunk reported at or after ``steps/2`` and the last
chunk, over the time between them), so PSLD is measured after it converged and start-up is excluded.
The load ratio is max/mean of ``ShardReport.busy_s`` per shard: PSLD's first load window (before any
move) against the sum of its last ``--last-windows`` windows.

PS-bound, like a cloud PS: every PS server gets an emulated network link (``--ps-bandwidth``, default
200 MB/s = 1.6 Gbit/s; each push and its reply take bytes / bandwidth on the shard, one transfer at
a time), so the shards, not the 2 shared CPU cores, bound the step rate, as they do for PSLD's and
CM-DARE's PS stragglers. The straggler (``--factor``, 3x) slows that shard's whole service (update and
link). ``--ps-bandwidth ''`` runs without the link (CPU-bound on this machine: see docs/benchmarks.md).

Elastic: one shard, no straggler, ``elastic_ps=True`` and PSLD placement; steps/s over time with the
``ps_add`` / ``ps_remove`` events marked goes to ``docs/images/psld_elastic.png``.

Usage: .venv/bin/python bench/psld.py [--steps 400] [--workers 2] [--ps 3] [--elastic-steps 600]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import collector
from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

STATIC = ("round-robin", "greedy", "mxnet", "byteps")
# Without a straggler round-robin and greedy put the 16 MiB tensor whole on one shard; they are measured
# under the straggler only (to keep the benchmark near 5 minutes).
BALANCED_STATIC = ("greedy", "mxnet", "byteps")
MODEL = "resnet8_fc"
IMG = Path(__file__).resolve().parent.parent / "docs" / "images"


def heaviest_shard(placement: str, ps: int) -> int:
    """The shard holding the most bytes under ``placement`` (ties: the lowest index)."""
    import torch

    from cmdare.ps.blocks import param_infos
    from cmdare.ps.placement import get_placement
    from cmdare.workloads import build_model

    with torch.device("meta"):
        model = build_model(MODEL, num_classes=10, in_channels=1)
    infos = param_infos((n, p.shape) for n, p in model.named_parameters())
    loads = get_placement(placement).place(infos, ps).shard_bytes()
    return loads.index(max(loads))


def run(args: argparse.Namespace, placement: str, ps: int, steps: int, straggler: str | None,
        elastic: bool = False) -> tuple[Any, Any]:
    """One Trainer run; returns (summary, collected reports)."""
    from cmdare.train import Trainer, TrainSpec

    spec = TrainSpec(model=MODEL, dataset="digits", workers=args.workers, ps=ps, steps=steps,
                     batch_size=args.batch_size, placement=placement, checkpoint_every=0, eval_every=0,
                     seed=args.seed, chunk_steps=args.chunk_steps, straggler=straggler, elastic_ps=elastic,
                     balance_every=args.balance_every, ps_bandwidth=args.ps_bandwidth or None)
    cb = collector()
    with tempfile.TemporaryDirectory() as tmp:
        summary = Trainer(spec, [cb], checkpoint_dir=tmp).run()
    if summary.status != "finished":
        raise RuntimeError(f"{placement} run ended {summary.status}")
    return summary, cb


def steady_rate(cb: Any, from_step: int) -> float:
    """Global steps/s from the first chunk reported at or after ``from_step`` to the last chunk."""
    reps = [r for r in cb.steps if r.global_step >= from_step]
    if len(reps) < 2:
        raise RuntimeError(f"only {len(reps)} chunks after step {from_step}: raise --steps")
    a, b = reps[0], reps[-1]
    return (b.global_step - a.global_step) / (b.time - a.time)


def windows(cb: Any) -> list[dict[int, float]]:
    """Shard busy seconds per collection window (all shards collected at once share a time)."""
    by_time: dict[float, dict[int, float]] = {}
    for r in cb.shards:
        by_time.setdefault(r.time, {})[r.shard_id] = r.busy_s
    return [w for _, w in sorted(by_time.items()) if sum(w.values()) > 0]


def load_ratio(busy: dict[int, float]) -> float:
    vals = list(busy.values())
    return max(vals) / statistics.fmean(vals) if vals and statistics.fmean(vals) > 0 else float("nan")


def plot_elastic(cb: Any, path: Path, load: float, straggler: str, bandwidth: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = cb.steps[0].time - cb.steps[0].duration_s
    ts = [r.time - t0 for r in cb.steps]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(ts, [r.cluster_steps_per_s for r in cb.steps], lw=1.2, label="cluster steps/s (5 s window)")
    labelled = set()
    for e in cb.events:
        if e.kind in ("ps_add", "ps_remove"):
            color = "tab:green" if e.kind == "ps_add" else "tab:red"
            ax.axvline(e.time - t0, color=color, ls="--", lw=1,
                       label=None if e.kind in labelled else e.kind)
            labelled.add(e.kind)
            ax.annotate(f"{e.details.get('num_shards')} shards", (e.time - t0, ax.get_ylim()[1] * 0.02),
                        rotation=90, fontsize=7, color=color)
        elif e.kind == "ps_move":
            ax.axvline(e.time - t0, color="0.7", ls=":", lw=0.8, label=None if "move" in labelled else "ps_move")
            labelled.add("move")
    ax.set_xlabel("time since first chunk (s)")
    ax.set_ylabel("global steps/s")
    slow = f", shard 0 slowed {straggler.split(':')[1]}x" if straggler else ""
    link = f", PS link {bandwidth}" if bandwidth else ""
    ax.set_title(f"PSLD elastic shards from 1 ({MODEL}, 2 workers{slow}{link}; 2-core machine, "
                 f"load ~{load:.0f})", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--chunk-steps", type=int, default=5)
    ap.add_argument("--balance-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--factor", type=float, default=3.0, help="straggler slowdown factor")
    ap.add_argument("--ps-bandwidth", default="200MB/s",
                    help="emulated link of every PS server ('' for none: shards then bound by CPU only)")
    ap.add_argument("--only", default="", help="comma list of placements to run (default: all)")
    ap.add_argument("--last-windows", type=int, default=3)
    ap.add_argument("--elastic-steps", type=int, default=600)
    ap.add_argument("--elastic-straggler", default="",
                    help="straggler for the elastic run (e.g. 0:3 to saturate the single shard)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: straggler,balanced,elastic")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    load_start = os.getloadavg()[0]
    t_bench = time.time()

    import ray

    logging.getLogger("ray").setLevel(logging.ERROR)
    start_local_ray(num_cpus=max(8, args.workers + args.ps + 3))
    half = args.steps // 2
    out: dict[str, Any] = {"model": MODEL, "workers": args.workers, "ps": args.ps, "steps": args.steps,
                           "ps_bandwidth": args.ps_bandwidth,
                           "straggler_factor": args.factor, "measured_from_step": half}
    try:
        if "straggler" not in skip:
            rates: dict[str, float] = {}
            for name in [n for n in (*STATIC, "psld") if not only or n in only]:
                slow = heaviest_shard(name, args.ps)
                out.setdefault("straggler_shard", {})[name] = slow
                _, cb = run(args, name, args.ps, args.steps, f"{slow}:{args.factor:g}")
                rates[name] = steady_rate(cb, half)
                w = windows(cb)
                print(f"straggler {name:12s} {rates[name]:6.2f} steps/s  first-window max/mean "
                      f"{load_ratio(w[0]):.2f}  moves {sum(e.kind == 'ps_move' for e in cb.events)}", flush=True)
                if name == "psld":
                    last: dict[int, float] = {}
                    for win in w[-args.last_windows:]:
                        for k, v in win.items():
                            last[k] = last.get(k, 0.0) + v
                    out["load_ratio_before"] = load_ratio(w[0])
                    out["load_ratio_after"] = load_ratio(last)
                    out["psld_moves"] = sum(e.details.get("moves", 0) for e in cb.events if e.kind == "ps_move")
                    out["psld_busy_first"] = {str(k): round(v, 3) for k, v in sorted(w[0].items())}
                    out["psld_busy_last"] = {str(k): round(v, 3) for k, v in sorted(last.items())}
                else:
                    out.setdefault("static_load_ratio", {})[name] = load_ratio(
                        {k: sum(win.get(k, 0.0) for win in w[len(w) // 2:]) for k in w[-1]})
            best = max((n for n in STATIC if n in rates), key=lambda n: rates[n])
            out["straggler_steps_per_s"] = rates
            out["best_static"] = best
            out["speedup_vs_best_static"] = rates["psld"] / rates[best]
        if "balanced" not in skip:
            rates_b: dict[str, float] = {}
            for name in (*BALANCED_STATIC, "psld"):
                _, cb = run(args, name, args.ps, args.steps, None)
                rates_b[name] = steady_rate(cb, half)
                print(f"balanced  {name:12s} {rates_b[name]:6.2f} steps/s", flush=True)
            best_b = max(BALANCED_STATIC, key=lambda n: rates_b[n])
            out["balanced_steps_per_s"] = rates_b
            out["best_static_balanced"] = best_b
            out["speedup_balanced"] = rates_b["psld"] / rates_b[best_b]
        if "elastic" not in skip:
            summary, cb = run(args, "psld", 1, args.elastic_steps, args.elastic_straggler or None, elastic=True)
            ev = [(round(e.time - cb.steps[0].time, 1), e.kind, e.details.get("num_shards"))
                  for e in cb.events if e.kind in ("ps_add", "ps_remove")]
            q = len(cb.steps) // 4
            first_q = [r.cluster_steps_per_s for r in cb.steps[1:q]]
            last_q = [r.cluster_steps_per_s for r in cb.steps[-q:]]
            out["elastic"] = {"events": ev, "final_shards": ev[-1][2] if ev else 1,
                              "steps_per_s_first_quarter": statistics.fmean(first_q) if first_q else None,
                              "steps_per_s_last_quarter": statistics.fmean(last_q) if last_q else None,
                              "mean_steps_per_s": summary.steps_per_s}
            print(f"elastic   events {ev}", flush=True)
            adds = [e.time for e in cb.events if e.kind in ("ps_add", "ps_remove")]
            if adds:  # global steps/s (not windowed) before the first change and after it settled
                pre = [r for r in cb.steps if r.time <= adds[0]]
                post = [r for r in cb.steps if r.time >= adds[0] + 2.0]
                if len(pre) >= 2 and len(post) >= 2:
                    out["elastic"]["steps_per_s_before_first_change"] = (
                        (pre[-1].global_step - pre[0].global_step) / (pre[-1].time - pre[0].time))
                    out["elastic"]["steps_per_s_after_first_change"] = (
                        (post[-1].global_step - post[0].global_step) / (post[-1].time - post[0].time))
            plot_elastic(cb, IMG / "psld_elastic.png", load_start, args.elastic_straggler, args.ps_bandwidth)
    finally:
        ray.shutdown()
    out["load_avg_start"] = round(load_start, 1)
    out["load_avg_end"] = round(os.getloadavg()[0], 1)
    out["wall_s"] = round(time.time() - t_bench, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
