"""PS data path: push + pull (with the shard's momentum update) of a 10 MB model, 1 worker, 1 shard.

Variants, interleaved round by round in one run so machine drift hits all alike:

* ``cmdare``: the real :class:`cmdare.ps.shard.AsyncShardActor` as a Ray actor on the driver's node,
  driven the way :class:`cmdare.train.workers.worker.Worker` drives a shard on its own node: through the
  shard's channel (:mod:`cmdare.ps.channel`): the gradient lies in the worker's shared host buffer
  (where backward leaves it), one request on the Unix socket, the shard updates and writes its
  parameters into the worker's buffer (the model's storage on a CPU), one reply.
* ``cmdare_ray``: the path to a shard on another node: one ``push_pull`` call per step with the numpy
  gradient through Ray, the returned parameters copied into the flat buffer (``set_shard_params``);
  a second shard actor, with no channel open.
* ``naive_ray``: a naive Ray actor PS: ``push(grad)`` applies momentum SGD in numpy, a second call
  ``pull()`` returns the parameters (also copied into the flat buffer).
* ``gloo``: PyTorch DDP's transport: ``torch.distributed.all_reduce`` of the same 10 MB between 2
  processes with the gloo backend on 127.0.0.1 (time on rank 0).
* ``floor``: in one process, one ``ray.put`` of 10 MB, ``cmdare.ps.optimizer.sgd_update``, one more
  ``ray.put``: the object-store writes and the update any PS round trip must do.

Targets (issues 2, 18): cmdare <= 0.7x gloo, <= 0.7x naive Ray, <= 1.5x floor, at steady state.

Usage: .venv/bin/python bench/ps_datapath.py [--mb 10] [--rounds 12] [--iters 25] [--warmup 60]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

VARIANTS = ("cmdare", "cmdare_ray", "naive_ray", "gloo", "floor")
# Where the time goes, measured in the same rounds: one ray.put of the model, the shard's update,
# the worker's copy into its flat buffer, and an empty actor call (Ray's per-call overhead).
PARTS = ("part_put", "part_update", "part_copyto", "part_rpc")


class NaivePS:
    """The naive baseline: gradient as a call argument, numpy momentum SGD, parameters from a 2nd call."""

    def __init__(self, params: np.ndarray, lr: float, momentum: float, weight_decay: float):
        self.params = params.copy()
        self.buf = np.zeros_like(self.params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def push(self, grad: np.ndarray) -> None:
        d_p = grad + self.weight_decay * self.params
        self.buf = self.momentum * self.buf + d_p
        self.params -= self.lr * self.buf

    def pull(self) -> np.ndarray:
        return self.params

    def noop(self) -> None:
        return None

    def torch_threads(self) -> int:
        import torch

        return torch.get_num_threads()


def _gloo_proc(rank: int, port: int, numel: int, cmd_q, res_q) -> None:
    """One gloo rank: waits for a round size, runs that many all-reduces, rank 0 reports times."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(numel, dtype=torch.float32)
    while True:
        n = cmd_q.get()
        if n is None:
            break
        times = []
        dist.barrier()
        for _ in range(n):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        t.fill_(1.0)  # keep the values finite
        if rank == 0:
            res_q.put(times)
    dist.destroy_process_group()


class Gloo:
    """Two gloo processes kept alive across rounds; ``run(n)`` returns rank 0's per-call times."""

    def __init__(self, numel: int):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.cmd_qs = [ctx.Queue(), ctx.Queue()]
        self.res_q = ctx.Queue()
        self.procs = [ctx.Process(target=_gloo_proc, args=(r, port, numel, self.cmd_qs[r], self.res_q),
                                  daemon=True) for r in range(2)]
        for p in self.procs:
            p.start()

    def run(self, n: int) -> list[float]:
        for q in self.cmd_qs:
            q.put(n)
        return self.res_q.get(timeout=300)

    def close(self) -> None:
        for q in self.cmd_qs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=10.0, help="model size in MB (float32)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iters", type=int, default=25, help="calls per variant per round")
    ap.add_argument("--warmup", type=int, default=60, help="calls per variant before measuring")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were

    import ray
    import torch

    from cmdare.ps.blocks import Block
    from cmdare.ps.channel import ChannelClient, SharedHostMemory
    from cmdare.ps.optimizer import UPDATE_CHUNK_ELEMS, OptimizerConfig, sgd_update
    from cmdare.ps.shard import AsyncShardActor, BlockData

    torch.set_num_threads(1)  # the driver plays a 1-CPU worker
    numel = int(args.mb * 1e6 / 4)
    cfg = OptimizerConfig(lr=0.01, momentum=0.9, weight_decay=1e-4)
    rng = np.random.default_rng(0)
    params0 = rng.standard_normal(numel).astype(np.float32)
    grad = (rng.standard_normal(numel) * 1e-3).astype(np.float32)

    gloo = Gloo(numel)  # start before Ray so the children do not inherit Ray's state
    start_local_ray(num_cpus=4)
    try:
        shard, shard_ray = (ray.remote(AsyncShardActor).options(num_cpus=1).remote(0, cfg) for _ in range(2))
        ray.get([s.load.remote(BlockData((Block(0, 0, "w", 0, numel),), params0, np.zeros_like(params0), 0))
                 for s in (shard, shard_ray)])
        memory = SharedHostMemory(numel)  # the worker's host buffers: parameters and gradients
        memory.grads.numpy()[:] = grad  # as backward leaves them
        _, address = ray.get(shard.channel.remote())
        channel = ChannelClient(address, memory, 0, numel)
        memory.close()
        naive = ray.remote(NaivePS).options(num_cpus=1).remote(params0, cfg.lr, cfg.momentum, cfg.weight_decay)
        ray.get(naive.pull.remote())
        flat = np.zeros(numel, np.float32)  # the worker's host flat buffer
        f_params, f_buf, f_scratch = params0.copy(), np.zeros_like(params0), np.empty_like(params0)

        def step_cmdare() -> None:
            channel.send(None, time.time(), 0)
            channel.receive()

        def step_cmdare_ray() -> None:
            values, _, _ = ray.get(shard_ray.push_pull.remote(grad))
            np.copyto(flat, values)

        def step_naive() -> None:
            ray.get(naive.push.remote(grad))
            np.copyto(flat, ray.get(naive.pull.remote()))

        def step_floor() -> None:
            ref_in = ray.put(grad)
            sgd_update(f_params, grad, f_buf, cfg.lr, cfg, f_scratch)
            ref_out = ray.put(f_params)
            del ref_in, ref_out

        u_params, u_buf, u_scratch = params0.copy(), np.zeros_like(params0), np.empty(UPDATE_CHUNK_ELEMS, np.float32)

        def part_put() -> None:
            ref = ray.put(grad)
            del ref

        local = {"cmdare": step_cmdare, "cmdare_ray": step_cmdare_ray, "naive_ray": step_naive, "floor": step_floor,
                 "part_put": part_put,
                 "part_update": lambda: sgd_update(u_params, grad, u_buf, cfg.lr, cfg, u_scratch),
                 "part_copyto": lambda: np.copyto(flat, grad),
                 "part_rpc": lambda: ray.get(naive.noop.remote())}

        def timed(fn, n: int) -> list[float]:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out

        t_start = time.perf_counter()
        for name in VARIANTS + PARTS:  # warm-up: the first tens of calls are several times slower
            gloo.run(args.warmup) if name == "gloo" else timed(local[name], args.warmup)
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS + PARTS}
        round_medians: dict[str, list[float]] = {v: [] for v in VARIANTS + PARTS}
        for r in range(args.rounds):
            turn = r % len(VARIANTS)
            order = VARIANTS[turn:] + VARIANTS[:turn]  # rotate the order each round
            for name in order + PARTS:
                ts = gloo.run(args.iters) if name == "gloo" else timed(local[name], args.iters)
                samples[name].extend(ts)
                round_medians[name].append(statistics.median(ts))
        wall_s = time.perf_counter() - t_start
        actor_threads = ray.get(naive.torch_threads.remote())
        channel.close()
        assert np.isfinite(memory.params.numpy()).all() and memory.params.numpy().any()  # the shard wrote here
    finally:
        gloo.close()
        ray.shutdown()

    med = {v: statistics.median(samples[v]) * 1e3 for v in VARIANTS + PARTS}
    result = {
        "benchmark": "ps_datapath",
        "model_mb": args.mb,
        "numel": numel,
        "cmdare_ms": round(med["cmdare"], 3),
        "cmdare_ray_ms": round(med["cmdare_ray"], 3),
        "naive_ray_ms": round(med["naive_ray"], 3),
        "gloo_ms": round(med["gloo"], 3),
        "floor_ms": round(med["floor"], 3),
        "ratio_vs_gloo": round(med["cmdare"] / med["gloo"], 3),
        "ratio_vs_naive_ray": round(med["cmdare"] / med["naive_ray"], 3),
        "ratio_vs_floor": round(med["cmdare"] / med["floor"], 3),
        "ratio_ray_path_vs_gloo": round(med["cmdare_ray"] / med["gloo"], 3),
        "target_vs_gloo": 0.7,
        "target_vs_naive_ray": 0.7,
        "target_vs_floor": 1.5,
        # spread of the per-round medians (min, max) in ms: a wide spread means a noisy machine
        "round_median_spread_ms": {v: [round(min(m) * 1e3, 3), round(max(m) * 1e3, 3)]
                                   for v, m in round_medians.items()},
        "parts_ms": {p.removeprefix("part_"): round(med[p], 3) for p in PARTS},
        "p90_ms": {v: round(float(np.percentile(samples[v], 90)) * 1e3, 3) for v in VARIANTS},
        "samples_per_variant": args.rounds * args.iters,
        "actor_torch_threads": actor_threads,
        "wall_s": round(wall_s, 1),
    }
    result["met"] = {"gloo": result["ratio_vs_gloo"] <= 0.7, "naive_ray": result["ratio_vs_naive_ray"] <= 0.7,
                     "floor": result["ratio_vs_floor"] <= 1.5}
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
