"""Communication overlapped with backward: the same run with gradient pieces sent during backward and with
the whole gradient pushed after it, over an emulated PS link where communication is a real share of a step.

Both variants are :class:`cmdare.train.Trainer` runs, 1 worker and 1 shard on the local Ray instance (the
worker reaches the shard by the same-node channel), ``--ps-bandwidth`` emulating the PS server's link:
every byte of a push and of its reply takes bytes / bandwidth on the shard.

* ``overlap``: ``TrainSpec.overlap=True`` (the default): each piece of the gradient
  (:mod:`cmdare.train.workers.overlap`, 4 per shard, at parameter boundaries, from the last layer) goes to the
  shard the moment backward has produced it, so its link time runs while backward goes on; the
  (asynchronous) shard applies it at once and sends its parameters back, so the next parameters are
  pulled in the same order, during backward too.
* ``after_backward``: ``overlap=False``: the whole gradient is pushed when backward is done (the path
  before overlap).

``--path channel`` (the default) has the worker reach the shard by the same-node channel; ``--path ray``
turns channels off (``CMDARE_SHM=0``) so every piece and push is a Ray call, as for a shard on another node.

Rates are steady-state cluster steps/s from the ``StepReport`` callbacks (first chunks excluded), rounds
alternate the two variants (order flipped each round). From the after-backward run's figures:
``ideal_speedup`` is what hiding all of the push's link time would give, (compute + push + reply) /
(compute + reply); ``ideal_speedup_all_link`` hiding the reply's too, (compute + push + reply) / compute.

Usage: .venv/bin/python bench/overlap.py [--model resnet32] [--dataset synthetic] [--bandwidth 20MB/s]
       [--steps 40] [--rounds 3] [--path channel|ray]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1
from train_overhead import cmdare_steps_per_s

VARIANTS = ("overlap", "after_backward")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet32")
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bandwidth", default="20MB/s", help="the emulated PS link (--ps-bandwidth)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", type=int, default=2, help="first chunks excluded from the rate")
    ap.add_argument("--path", choices=("channel", "ray"), default="channel",
                    help="how the worker reaches the shard: the same-node channel, or Ray calls (CMDARE_SHM=0)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    if args.path == "ray":  # before Ray starts: its worker processes inherit it
        os.environ["CMDARE_SHM"] = "0"

    import ray
    import torch

    from cmdare.train.spec import parse_rate_bytes_per_s
    from cmdare.workloads import build_model

    torch.set_num_threads(1)
    nbytes = 4 * sum(p.numel() for p in build_model(args.model, num_classes=10, in_channels=3).parameters())
    link_s = nbytes / parse_rate_bytes_per_s(args.bandwidth)  # one way, per step
    start_local_ray(num_cpus=2)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    t_start = time.perf_counter()
    try:
        for r in range(args.rounds):
            for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                res = cmdare_steps_per_s(args.model, args.dataset, args.batch, args.steps, args.skip,
                                         ps_bandwidth=args.bandwidth, overlap=v == "overlap", chunk_steps=5)
                runs[v].append(res)
                print(v, json.dumps(res), flush=True)
    finally:
        ray.shutdown()
    med = {v: statistics.median(x["steps_per_s"] for x in runs[v]) for v in VARIANTS}
    step_after = 1.0 / med["after_backward"]
    result = {
        "benchmark": "overlap",
        "model": args.model, "dataset": args.dataset, "batch": args.batch, "model_mb": round(nbytes / 1e6, 3),
        "bandwidth": args.bandwidth, "link_s_per_direction": round(link_s, 4),
        "overlap_steps_per_s": round(med["overlap"], 3),
        "after_backward_steps_per_s": round(med["after_backward"], 3),
        "speedup": round(med["overlap"] / med["after_backward"], 3),
        "ideal_speedup": round(step_after / max(1e-9, step_after - link_s), 3),
        "ideal_speedup_all_link": round(step_after / max(1e-9, step_after - 2 * link_s), 3),
        "path": args.path,
        "speedup_per_round": [round(a["steps_per_s"] / b["steps_per_s"], 3)
                              for a, b in zip(runs["overlap"], runs["after_backward"], strict=True)],
        "comm_share": {v: round(statistics.median(x["comm_share"] for x in runs[v]), 3) for v in VARIANTS},
        "link_share_after_backward": round(2 * link_s / step_after, 3),
        "rounds": args.rounds, "steps": args.steps,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "loadavg_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
