"""GPU smoke benchmark: synchronous PS training on CUDA against the same run on the CPU.

Two real :class:`cmdare.train.Trainer` runs on one local Ray node (synchronous, 2 workers, 1 shard, the
digits data, ``--model`` for ``--steps`` steps, one checkpoint at the end, nothing recorded): one with
the workers on the GPU (``gpus_per_worker`` 0.5: both share the one GPU), one with the workers on the
CPU, same seed. Synchronous training is deterministic up to float rounding, so the final parameters
must agree to float tolerance (``max_abs_diff`` at most ``--tolerance``); the figures are each run's
seconds per global step at steady state (the first ``--skip`` steps left out) and their ratio.

Without CUDA (this project's CI machines) it prints ``{"bench": "gpu_smoke", "skipped": true, ...}`` and
exits 0 without starting Ray. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def _run(device: str, args: argparse.Namespace, root: Path) -> dict:
    from _common import collector
    from cmdare.train import Trainer, TrainSpec
    from cmdare.train.duties.checkpoint import CheckpointStore

    spec = TrainSpec(model=args.model, workers=2, ps=1, steps=args.steps, sync=True, checkpoint_every=args.steps,
                     eval_every=0, seed=3, transient=False, gpus_per_worker=0.5 if device == "cuda" else 0.0)
    log = collector()
    summary = Trainer(spec, [log], checkpoint_dir=root / device).run()
    steady = [s for s in log.steps if s.global_step > args.skip]
    span = steady[-1].time - steady[0].time if len(steady) > 1 else float("nan")
    made = steady[-1].global_step - steady[0].global_step if len(steady) > 1 else 0
    return {"params": CheckpointStore(root / device).load().params, "s_per_step": span / made if made else None,
            "status": summary.status, "steps": summary.global_step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet15")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--skip", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=1e-3)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_smoke", "skipped": True, "reason": "no CUDA device"}))
        return
    from cmdare.train.run.ray_session import start_local_ray

    ray = start_local_ray(num_cpus=4, num_gpus=1)
    import numpy as np

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        cuda, cpu = _run("cuda", args, Path(tmp)), _run("cpu", args, Path(tmp))
    ray.shutdown()
    diff = float(np.max(np.abs(cuda["params"] - cpu["params"])))
    out = {"bench": "gpu_smoke", "skipped": False, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "model": args.model, "steps": args.steps,
           "cuda_s_per_step": cuda["s_per_step"], "cpu_s_per_step": cpu["s_per_step"],
           "speedup_vs_cpu": cpu["s_per_step"] / cuda["s_per_step"] if cuda["s_per_step"] else None,
           "max_abs_diff": diff, "tolerance": args.tolerance, "matches_cpu": diff <= args.tolerance,
           "wall_s": time.time() - t0}
    print(json.dumps(out))
    sys.exit(0 if out["matches_cpu"] and cuda["status"] == cpu["status"] == "finished" else 1)


if __name__ == "__main__":
    main()
