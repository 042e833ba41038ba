"""Training overhead: 1 worker + 1 shard (cmdare Trainer, async) against a plain PyTorch loop.

For each model, A/B rounds alternate, a plain run before and after every cmdare run (so machine drift
hits both alike; a round's plain figure is the mean of the two around it):

* ``plain``: a single-process PyTorch loop in this process, ``torch.set_num_threads(1)`` (the worker
  actor gets 1 CPU), the same model, batch stream and SGD (momentum, weight decay) as the run;
  steps/s timed after a warm-up.
* ``cmdare``: :class:`cmdare.train.Trainer` with 1 worker and 1 shard on the already running local
  Ray instance; steady-state cluster steps/s from the ``StepReport`` callbacks: global steps between
  the end of the first ``--skip`` chunks and the last chunk over the time between them (start-up,
  warm-up and the final evaluation excluded; the coordinator's gaps between chunks included).

Configurations: ``small`` (resnet8 on digits 1x8x8, batch 32: per-step overhead dominates) and
``big`` (resnet32 on synthetic 3x32x32, batch 32). Target (issue 2): ratio >= 0.85.

Usage: .venv/bin/python bench/train_overhead.py [--configs small,big] [--rounds 3]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

CONFIGS = {
    # name: (model, dataset, batch, plain warm-up steps, plain timed steps, cmdare steps)
    "small": ("resnet8", "digits", 32, 100, 300, 400),
    "big": ("resnet32", "synthetic", 32, 3, 15, 45),
}


def plain_steps_per_s(model_name: str, dataset: str, batch: int, warmup: int, steps: int, seed: int = 0) -> float:
    """Steps/s of a plain single-process PyTorch training loop (1 thread), after ``warmup`` steps."""
    import torch
    import torch.nn.functional as F

    from cmdare.datasets import BatchStream, load_dataset
    from cmdare.train.spec import TrainSpec
    from cmdare.workloads import build_model

    cfg = TrainSpec().optimizer
    data = load_dataset(dataset, seed=seed)
    torch.manual_seed(seed)
    model = build_model(model_name, num_classes=data.num_classes, in_channels=data.input_shape[0])
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    stream = BatchStream(data, 0, 1, batch, seed)
    model.train()
    t0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        x, y = next(stream)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        float(loss.detach())  # the worker reads the loss every step too
    return steps / (time.perf_counter() - t0)


def cmdare_steps_per_s(model_name: str, dataset: str, batch: int, steps: int, skip: int,
                       **spec_options: object) -> dict[str, float]:
    """Steady-state steps/s of a 1-worker, 1-shard async cmdare run (from its StepReports); ``spec_options``
    are further :class:`TrainSpec` fields (e.g. an emulated link)."""
    import tempfile

    from cmdare.train import Trainer, TrainSpec
    from cmdare.train.callbacks import StepReport, TrainCallback

    class Collect(TrainCallback):
        def __init__(self) -> None:
            self.reports: list[StepReport] = []

        def on_step(self, report: StepReport) -> None:
            self.reports.append(report)

    spec = TrainSpec(model=model_name, dataset=dataset, workers=1, ps=1, steps=steps, batch_size=batch,
                     checkpoint_every=0, eval_every=0, **spec_options)
    cb = Collect()
    with tempfile.TemporaryDirectory() as tmp:
        summary = Trainer(spec, [cb], checkpoint_dir=tmp).run()
    reps = cb.reports
    if len(reps) <= skip + 1:
        raise RuntimeError(f"only {len(reps)} chunks reported; raise the step count")
    a, b = reps[skip - 1], reps[-1]
    used = reps[skip:]
    return {
        "steps_per_s": (b.global_step - a.global_step) / (b.time - a.time),
        # inside the worker only (no coordinator gaps): steps over chunk durations
        "worker_steps_per_s": sum(r.steps for r in used) / sum(r.duration_s for r in used),
        "comm_share": sum(r.comm_s for r in used) / sum(r.duration_s for r in used),
        "run_mean_steps_per_s": summary.steps_per_s,
        "chunks_used": len(used),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="small,big")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", type=int, default=3, help="first chunks excluded from the cmdare rate")
    ap.add_argument("--chunks-ahead", type=int, default=None,
                    help="chunks queued per worker (TrainSpec.chunks_ahead; default: the spec's, 1: one at a time)")
    args = ap.parse_args()
    if args.chunks_ahead is not None and args.chunks_ahead < 1:
        ap.error(f"--chunks-ahead must be at least 1, got {args.chunks_ahead}")
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were

    import ray
    import torch

    torch.set_num_threads(1)
    start_local_ray(num_cpus=2)
    t_start = time.perf_counter()
    out: dict[str, dict] = {}
    try:
        for name in args.configs.split(","):
            model, dataset, batch, warm, timed, steps = CONFIGS[name]
            plain, runs = [], []
            before = plain_steps_per_s(model, dataset, batch, warm, timed)
            for _ in range(args.rounds):
                # plain runs sandwich each cmdare run; the round's plain figure is their mean
                options = {} if args.chunks_ahead is None else {"chunks_ahead": args.chunks_ahead}
                runs.append(cmdare_steps_per_s(model, dataset, batch, steps, args.skip, **options))
                after = plain_steps_per_s(model, dataset, batch, warm, timed)
                plain.append((before + after) / 2)
                before = after
            c = [r["steps_per_s"] for r in runs]
            ratios = [ci / pi for ci, pi in zip(c, plain, strict=True)]  # per round (adjacent in time)
            out[name] = {
                "model": model, "dataset": dataset, "batch": batch,
                "plain_steps_per_s": round(statistics.median(plain), 2),
                "cmdare_steps_per_s": round(statistics.median(c), 2),
                "ratio": round(statistics.median(c) / statistics.median(plain), 3),
                "ratio_per_round": [round(r, 3) for r in ratios],
                "plain_range": [round(min(plain), 2), round(max(plain), 2)],
                "cmdare_range": [round(min(c), 2), round(max(c), 2)],
                "cmdare_worker_steps_per_s": round(statistics.median(r["worker_steps_per_s"] for r in runs), 2),
                "cmdare_comm_share": round(statistics.median(r["comm_share"] for r in runs), 3),
                "met": statistics.median(c) / statistics.median(plain) >= 0.85,
            }
            print(name, json.dumps(out[name]), flush=True)
    finally:
        ray.shutdown()
    from cmdare.train import TrainSpec

    ahead = TrainSpec().chunks_ahead if args.chunks_ahead is None else args.chunks_ahead
    result = {"benchmark": "train_overhead", "target_ratio": 0.85, "rounds": args.rounds, "chunks_ahead": ahead,
              "wall_s": round(time.perf_counter() - t_start, 1)}
    for name, r in out.items():
        result[f"ratio_{name}"] = r["ratio"]
    result["configs"] = out
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
