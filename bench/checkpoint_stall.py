"""Checkpoint stall: how long training waits per checkpoint, background uploads against inline ones.

Real :class:`cmdare.train.Trainer` runs (2 workers, 1 shard, async, synthetic data at a small image
size so that compute stays low while the checkpoint stays several MB; checkpoints every
``--every`` steps, periodic evaluation off, no revocations, nothing recorded to a store) for each
storage kind and mode:

* storage ``local``: a temporary directory; ``s3``: moto's standalone S3 server (a real S3-protocol
  HTTP server on 127.0.0.1, in its own process so that it does not share the coordinator's GIL;
  ``AWS_ENDPOINT_URL`` points s3fs at it, as a user would point it at MinIO or a bucket);
* mode ``background``: the default, the coordinator stores the chief's snapshot on a background
  thread; ``inline`` (``Trainer(..., background_uploads=False)``, the baseline): the coordinator
  loop stores it itself, so no worker gets new work until it is stored (a worker still inside its
  chunk of steps trains on meanwhile).

Per checkpoint, from the :class:`cmdare.events.CheckpointReport` callbacks (the final checkpoint,
taken after training ended, is left out): ``stall_s`` (what training waited for: the chief's snapshot
of the shards, timed in the chief; plus the upload inline, during which the coordinator hands out no
work), ``duration_s`` (the duty's start to the stored manifest), the upload time (``duration_s -
stall_s`` in background mode: it also holds the snapshot's trip to the coordinator) and the size.
Per run: steady-state cluster steps/s from the ``StepReport`` callbacks (global steps between the
end of the first ``--skip`` chunk reports and the last one over the time between them; the
checkpoints inside that window included, start-up and the final duties not), and the workers' idle
time per checkpoint (window time minus the worker's chunk durations, mean over workers, over the
number of checkpoints in the window; it includes the ordinary gaps between chunks).

Modes alternate in every round (background first in even rounds, inline first in odd ones) so that
machine drift hits both alike. Figures are medians over the checkpoints of all rounds (steps/s:
over rounds); ratios ``stall_ratio_KIND = stall background / stall inline`` (the figure of merit:
below 1 when the upload is off the training path) and
``steps_per_s_ratio_KIND = background / inline``.

Usage: .venv/bin/python bench/checkpoint_stall.py [--rounds 2] [--steps 100] [--model t2t_resnet32]
       [--every 10] [--image-size 8] [--batch 16] [--kinds local,s3]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

MODES = ("background", "inline")
BUCKET = "cmdare-bench"

# moto's S3 server in a child process; it runs until its stdin closes
_MOTO = ("import logging, sys\n"
         "from moto.server import ThreadedMotoServer\n"
         "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
         "server = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False)\n"
         "server.start()\n"
         "print('ready', flush=True)\n"
         "sys.stdin.read()\n"
         "server.stop()\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (own process) with the bucket created; yields its ``s3://`` URL.

    Sets the environment s3fs/boto3 read (test credentials, region, ``AWS_ENDPOINT_URL``) for this process.
    """
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _MOTO, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    old = {k: os.environ.get(k) for k in env}
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            raise RuntimeError("moto's S3 server did not start")
        os.environ.update(env)
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}"
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _collector() -> Any:
    from cmdare.events import CheckpointReport, StepReport, TrainCallback

    class Collect(TrainCallback):
        def __init__(self) -> None:
            self.steps: list[StepReport] = []
            self.checkpoints: list[CheckpointReport] = []

        def on_step(self, report: StepReport) -> None:
            self.steps.append(report)

        def on_checkpoint(self, report: CheckpointReport) -> None:
            self.checkpoints.append(report)

    return Collect()


def one_run(args: argparse.Namespace, location: str, background: bool) -> dict[str, Any]:
    """One training run storing its checkpoints in ``location``; its per-checkpoint and steady-state figures."""
    from cmdare.train import Trainer, TrainSpec

    spec = TrainSpec(model=args.model, dataset="synthetic", image_size=args.image_size, workers=2, ps=1,
                     steps=args.steps, batch_size=args.batch, checkpoint_every=args.every, eval_every=0,
                     transient=False)
    cb = _collector()
    t0 = time.perf_counter()
    summary = Trainer(spec, [cb], checkpoint_dir=location, background_uploads=background).run()
    wall = time.perf_counter() - t0
    if summary.status != "finished":
        raise RuntimeError(f"run ended {summary.status}")
    reps = cb.steps
    if len(reps) <= args.skip + 1:
        raise RuntimeError(f"only {len(reps)} chunks reported; raise --steps")
    a, b = reps[args.skip - 1], reps[-1]
    ckpts = [c for c in cb.checkpoints if c.global_step < spec.steps]  # the final one: after training
    if not ckpts:
        raise RuntimeError("no checkpoint during training; lower --every or raise --steps")
    window = b.time - a.time
    in_window = [c for c in ckpts if a.time <= c.time - c.duration_s <= b.time]
    idle = []
    for wid in {r.worker_id for r in reps}:
        busy = sum(r.duration_s for r in reps if r.worker_id == wid and a.time < r.time <= b.time)
        idle.append(max(0.0, window - busy))
    return {
        "stall_s": [c.stall_s for c in ckpts],
        "duration_s": [c.duration_s for c in ckpts],
        "upload_s": [c.duration_s - c.stall_s for c in ckpts],
        "size_bytes": [c.size_bytes for c in ckpts],
        "checkpoints": len(ckpts),
        "steps_per_s": (b.global_step - a.global_step) / window,
        "worker_idle_s_per_ckpt": statistics.mean(idle) / len(in_window) if in_window else None,
        "wall_s": wall,
    }


def _med(values: list[float], digits: int = 4) -> float:
    return round(statistics.median(values), digits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100, help="target global step of each run")
    ap.add_argument("--model", default="t2t_resnet32")
    ap.add_argument("--every", type=int, default=10, help="checkpoint every this many steps")
    ap.add_argument("--image-size", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kinds", default="local,s3")
    ap.add_argument("--skip", type=int, default=4, help="first chunk reports excluded from the steps/s window")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were

    import ray

    start_local_ray(num_cpus=4)  # 2 workers + 1 shard, 1 CPU each (logical: the machine has 2 cores)
    t_start = time.perf_counter()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(k, m): [] for k in kinds for m in MODES}
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
            base = {"local": tmp}
            if "s3" in kinds:
                base["s3"] = stack.enter_context(s3_server())
            for rnd in range(args.rounds):
                order = MODES if rnd % 2 == 0 else MODES[::-1]
                for kind in kinds:
                    for mode in order:
                        res = one_run(args, f"{base[kind]}/r{rnd}-{mode}", mode == "background")
                        runs[(kind, mode)].append(res)
                        print(kind, mode, f"round {rnd}:", json.dumps({
                            "stall_s": _med(res["stall_s"]), "duration_s": _med(res["duration_s"]),
                            "checkpoints": res["checkpoints"],
                            "steps_per_s": round(res["steps_per_s"], 2), "wall_s": round(res["wall_s"], 1)}),
                            flush=True)
    finally:
        ray.shutdown()

    result: dict[str, Any] = {"benchmark": "checkpoint_stall", "model": args.model, "dataset": "synthetic",
                              "image_size": args.image_size, "batch": args.batch, "workers": 2, "shards": 1,
                              "steps": args.steps, "checkpoint_every": args.every, "rounds": args.rounds}
    sizes: list[int] = []
    for kind in kinds:
        for mode in MODES:
            rs = runs[(kind, mode)]
            pool = {key: [v for r in rs for v in r[key]] for key in ("stall_s", "duration_s", "upload_s", "size_bytes")}
            sizes += pool["size_bytes"]
            sps = [r["steps_per_s"] for r in rs]
            idle = [r["worker_idle_s_per_ckpt"] for r in rs if r["worker_idle_s_per_ckpt"] is not None]
            tag = f"{kind}_{mode}"
            result[f"stall_s_{tag}"] = _med(pool["stall_s"])
            result[f"duration_s_{tag}"] = _med(pool["duration_s"])
            if mode == "background":
                result[f"upload_s_{tag}"] = _med(pool["upload_s"])
            result[f"stall_range_{tag}"] = [round(min(pool["stall_s"]), 4), round(max(pool["stall_s"]), 4)]
            result[f"steps_per_s_{tag}"] = round(statistics.median(sps), 2)
            result[f"steps_per_s_range_{tag}"] = [round(min(sps), 2), round(max(sps), 2)]
            result[f"worker_idle_s_per_ckpt_{tag}"] = round(statistics.median(idle), 4) if idle else None
            result[f"checkpoints_{tag}"] = sum(r["checkpoints"] for r in rs)
        bg, il = f"{kind}_background", f"{kind}_inline"
        result[f"stall_ratio_{kind}"] = round(result[f"stall_s_{bg}"] / result[f"stall_s_{il}"], 3)
        result[f"steps_per_s_ratio_{kind}"] = round(result[f"steps_per_s_{bg}"] / result[f"steps_per_s_{il}"], 3)
        result[f"steps_per_s_ratio_per_round_{kind}"] = [  # the two modes of a round ran back to back
            round(x["steps_per_s"] / y["steps_per_s"], 3) for x, y in zip(runs[(kind, "background")],
                                                                          runs[(kind, "inline")], strict=True)]
    result["checkpoint_bytes"] = int(statistics.median(sizes))
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
