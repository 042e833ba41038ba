"""PS scaling: how the data path's and the coordinator's costs grow with workers and shards.

(a) Data path. k = 1, 2, 4, 8 worker actors (0 CPUs each, no model: a synthetic 10 MB gradient in a flat
buffer) push and pull as fast as they can, together, for a fixed window, against real
:class:`cmdare.ps.shard.AsyncShardActor` shards (momentum SGD): 1 shard holding the 10 MB, or 2 shards holding
5 MB each (a worker then sends to both and gathers both replies, as ``Worker.run_steps`` does, with
``receive_all``). Paths: ``tcp``, each worker over each shard's TCP channel (:mod:`cmdare.ps.tcp_channel`, the
cross-node carrier, here on 127.0.0.1); ``ray``, ``push_pull`` calls with the gradient as a Ray object and the
parameters copied back (other shard actors, no channel open; on one node the objects stay in the node's
store, so this is a lower bound of the cross-node Ray path). Reported: aggregate push+pulls per second (each
moves the whole 10 MB model in and out), the shards' bytes per second, each worker's median step. In the
same run, gloo ``all_reduce`` of 10 MB among k processes (TCP, 127.0.0.1; one process group per k of 8
processes kept alive): ms per all-reduce and the aggregate exchanges per second (k per all-reduce), the
figure to hold against the PS's push+pulls per second. Variants interleaved by rounds (order rotated).
Single-node Ray on 127.0.0.1, not the netns cluster (``bench/cross_node.py`` has the two-node path): with
every process on the same 2 cores, everything here is CPU-bound; the JSON says so.

(b) Coordinator. The real :class:`cmdare.train.trainer.Trainer` and its :class:`~cmdare.train.run.ray_driver.RayDriver`
(controller, executors, one real shard of resnet8) run with 8, 32 and 64 stub worker actors (0 CPUs; every
``run_steps`` returns a chunk result at once, the global step kept in a shared counter; a pool of pre-started
actors is handed to ``WorkerExecutor`` in place of ``Worker`` actors). In the steady state of each run
(chunks 20%-90% of about 1000 chunks of 10 steps), per chunk: ``coordinator_us_per_chunk`` = CPU time of the
driver's main thread (the loop that waits on Ray, takes each chunk result, hands the controller its events
and submits the next chunk: the serial part that caps a run's chunks per second); in ``coordinator``: the
driver process's CPU time (Ray's own threads too), the wall time between chunks (on 2 cores the stubs, the
raylet and the driver share them), and the main thread's wall time in ``_chunk_back`` (one chunk's handling),
of which ``controller`` (``RunController.handle``) and ``submit`` (``_feed``: the next ``run_steps.remote``).
Each size runs ``--coord-rounds`` times, interleaved; medians. A stub learns only its worker id and the step
budget (the run's spec carries its model and data, which would import torch in every stub) and returns a real
``ChunkResult`` (``cmdare.train.workers.chunk_result``, which imports no torch).

Targets: none (a characterisation for docs/benchmarks.md).

Usage: .venv/bin/python bench/ps_scaling.py [--mb 10] [--rounds 2] [--window 1.2] [--workers 1,2,4,8]
       [--coord-workers 8,32,64] [--coord-chunks 1000] [--coord-rounds 2] [--no-ray-path]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import statistics
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1
from cmdare.train.workers.chunk_result import ChunkResult

# -- gloo among k of 8 processes ------------------------------------------------------------------------------


def _gloo_proc(rank: int, world: int, sizes: tuple[int, ...], port: int, numel: int, cmd_q, res_q) -> None:
    """One of ``world`` gloo ranks; a command (k, n) to ranks < k runs n all-reduces in the group of the first k."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = {k: dist.new_group(list(range(k))) for k in sizes if 1 < k < world}  # every rank makes every group
    groups[world] = None
    t = torch.ones(numel, dtype=torch.float32)
    while True:
        cmd = cmd_q.get()
        if cmd is None:
            break
        k, n = cmd
        group = groups[k]
        dist.barrier(group=group)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            dist.all_reduce(t, group=group)
            times.append(time.perf_counter() - t0)
        t.fill_(1.0)
        if rank == 0:
            res_q.put(times)
    dist.destroy_process_group()


class GlooGroups:
    """``world`` gloo processes, kept alive; ``run(k, n)``: rank 0's times of n all-reduces among ranks < k."""

    def __init__(self, world: int, sizes: tuple[int, ...], numel: int):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.cmd_qs = [ctx.Queue() for _ in range(world)]
        self.res_q = ctx.Queue()
        self.procs = [ctx.Process(target=_gloo_proc, args=(r, world, sizes, port, numel, self.cmd_qs[r], self.res_q),
                                  daemon=True) for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, k: int, n: int) -> list[float]:
        for q in self.cmd_qs[:k]:
            q.put((k, n))
        return self.res_q.get(timeout=300)

    def close(self) -> None:
        for q in self.cmd_qs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


# -- (a) the data path's workers ------------------------------------------------------------------------------

class FlatWorker:
    """A worker without a model: its flat gradient and parameter buffers and its channels to the shards."""

    def __init__(self, numel: int, seed: int):
        rng = np.random.default_rng(seed)
        self.numel = numel
        self.grad = (rng.standard_normal(numel) * 1e-3).astype(np.float32)
        self.params = np.zeros(numel, np.float32)
        self.clients: dict[int, dict[int, Any]] = {}  # shard count -> {shard: its TCP client}
        self.ray_shards: dict[int, list[Any]] = {}
        self.step = 0

    def connect(self, tcp: dict[int, list[Any]], ray_shards: dict[int, list[Any]]) -> None:
        """``tcp``: shard count -> the TCP channel addresses of that many shards splitting the model evenly."""
        from cmdare.ps.tcp_channel import TcpChannelClient

        for s, addresses in tcp.items():
            bounds = np.linspace(0, self.numel, s + 1).astype(int)
            self.clients[s] = {k: TcpChannelClient(a, self.params[bounds[k]:bounds[k + 1]],
                                                   self.grad[bounds[k]:bounds[k + 1]], timeout=10.0)
                               for k, a in enumerate(addresses)}
        self.ray_shards = ray_shards

    def _tcp_step(self, s: int) -> None:
        from cmdare.ps.channel import receive_all

        clients = self.clients[s]
        t1, sent_at = time.perf_counter(), time.time()
        for c in clients.values():
            c.send(self.step, sent_at, 0)
        replies = receive_all(clients, t1)
        self.step = max(r[0] for r in replies.values())

    def _ray_step(self, s: int) -> None:
        import ray

        shards = self.ray_shards[s]
        bounds = np.linspace(0, self.numel, s + 1).astype(int)
        sent_at = time.time()
        refs = [sh.push_pull.remote(self.grad[bounds[k]:bounds[k + 1]], self.step, sent_at, 0)
                for k, sh in enumerate(shards)]
        for k, (values, step, _) in enumerate(ray.get(refs)):
            np.copyto(self.params[bounds[k]:bounds[k + 1]], values)  # FlatLayout.set_shard_params
            self.step = max(self.step, step)

    def warm(self, n: int) -> None:
        for s in self.clients:
            for _ in range(n):
                self._tcp_step(s)
        for s in self.ray_shards:
            for _ in range(n):
                self._ray_step(s)

    def run(self, path: str, s: int, start_at: float, window_s: float) -> list[float]:
        """Steps from ``start_at`` (wall clock, shared by all workers) for ``window_s``; each finished step's time."""
        step = self._tcp_step if path == "tcp" else self._ray_step
        time.sleep(max(0.0, start_at - time.time()))
        end, times = start_at + window_s, []
        while time.time() < end:
            t0 = time.perf_counter()
            step(s)
            if time.time() <= end:
                times.append(time.perf_counter() - t0)
        return times

    def params_finite(self) -> bool:
        return bool(np.isfinite(self.params).all() and self.params.any())


# -- (b) the coordinator's stub workers ------------------------------------------------------------------------

@dataclass(frozen=True)
class StubEval:
    loss: float
    metrics: dict[str, float]

    @property
    def accuracy(self) -> float | None:
        return self.metrics.get("accuracy")


class StubWorker:
    """Answers the coordinator's calls at once; the run's global step is a counter in a shared file."""

    def __init__(self, counter: str):
        self.fd = os.open(counter, os.O_RDWR)
        self.worker_id, self.max_step, self.step = -1, 0, 0

    def adopt(self, worker_id: int, max_step: int) -> None:
        self.worker_id, self.max_step, self.step = worker_id, max_step, 0

    def ready(self) -> tuple[str, float]:
        import ray

        return ray.get_runtime_context().get_node_id(), time.time()

    def run_steps(self, max_steps: int, max_s: float, step_s: float = 0.0, stop_at: int | None = None) -> ChunkResult:
        t0 = time.perf_counter()
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            g = struct.unpack("q", os.pread(self.fd, 8, 0))[0]
            limit = min(self.max_step, stop_at if stop_at is not None else self.max_step)
            steps = max(0, min(max_steps, limit - g))
            os.pwrite(self.fd, struct.pack("q", g + steps), 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        self.step = g + steps
        done = g + steps >= self.max_step and steps < max_steps
        return ChunkResult(self.worker_id, steps, time.perf_counter() - t0, 1.0, 0.0, 0.0, self.step, (0,) * steps,
                           done, None, (0.0,))

    def pull(self) -> int:
        return self.step

    def set_layout(self, *args: Any) -> int:
        return 0

    def load_buffers(self, buffers: Any) -> None:
        pass

    def buffers(self) -> dict[str, Any]:
        return {}

    def statistics(self, params: Any, step: int) -> dict[str, Any]:
        return {}

    def evaluate(self, params: Any = None, step: int | None = None, max_samples: int | None = None):
        return StubEval(1.0, {"accuracy": 0.0}), self.step

    def leave(self) -> None:
        pass

    def ping(self) -> int:
        return self.step


class StubPool:
    """Stands in for ``actor_class(Worker)``: ``.options(...).remote(*args)`` hands out a started stub, adopted."""

    def __init__(self, actors: list[Any]):
        self.free = list(actors)

    def options(self, **_: Any) -> StubPool:
        return self

    def remote(self, worker_id: int, slot: int, workers: int, spec: Any, *rest: Any) -> Any:
        actor = self.free.pop(0)
        # Only what a stub uses: the run's spec carries its task (model and data), whose unpickling would
        # import torch and the dataset in every stub. Runs before the executor's ready() (one caller's calls
        # run in order).
        actor.adopt.remote(worker_id, spec.steps)
        return actor


def coordinator_run(n_workers: int, chunks: int, pool: StubPool, counter: str, tmp: Path) -> dict:
    """One real Trainer run with ``n_workers`` stubs and about ``chunks`` chunks; the driver's costs per chunk
    between the chunks 20% and 90% of the way (CPU clocks read only there: on this VM a read costs 1-100 us)."""
    import cmdare.train.workers.worker_executor as worker_executor
    from cmdare.control import RunController
    from cmdare.train.run.ray_driver import RayDriver
    from cmdare.train.spec import TrainSpec
    from cmdare.train.trainer import Trainer

    chunk_steps = 10
    per_worker = max(4, chunks // n_workers)
    spec = TrainSpec(model="resnet8", dataset="digits", workers=n_workers, ps=1, batch_size=4,
                     steps=n_workers * per_worker * chunk_steps, chunk_steps=chunk_steps,
                     checkpoint_every=0, eval_every=0, cpus_per_worker=0, cpus_per_shard=0)
    Path(counter).write_bytes(bytes(8))
    lo, hi = int(0.2 * n_workers * per_worker), int(0.9 * n_workers * per_worker)
    clocks: dict[int, tuple[float, float, float]] = {}  # chunk index -> (wall, main thread CPU, process CPU)
    spent = {"chunk_back": 0.0, "controller": 0.0, "submit": 0.0}  # main-thread wall seconds, in the window
    count = [0]
    originals = (RayDriver._chunk_back, RayDriver._feed, RunController.handle, worker_executor.actor_class,
                 worker_executor.WorkerExecutor.kill_all)
    handed: list[Any] = []

    def timed(name: str, fn):
        def wrapper(*a, **kw):
            if not lo <= count[0] < hi:
                return fn(*a, **kw)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    def chunk_back(self, ref, wall):
        if count[0] in (lo, hi):
            clocks[count[0]] = (time.perf_counter(), time.thread_time(), time.process_time())
        originals[0](self, ref, wall)
        count[0] += 1

    def kill_all(self):  # the stubs go back to the pool, not to Ray's kill
        handed.extend(w.actor for w in self.workers.values())

    RayDriver._chunk_back = timed("chunk_back", chunk_back)
    RayDriver._feed = timed("submit", originals[1])
    RunController.handle = timed("controller", originals[2])
    worker_executor.actor_class = lambda cls: pool
    worker_executor.WorkerExecutor.kill_all = kill_all
    try:
        t0 = time.perf_counter()
        summary = Trainer(spec, checkpoint_dir=tmp / f"coord-{n_workers}", background_uploads=True).run()
        run_s = time.perf_counter() - t0
    finally:
        (RayDriver._chunk_back, RayDriver._feed, RunController.handle, worker_executor.actor_class,
         worker_executor.WorkerExecutor.kill_all) = originals
        pool.free.extend(handed)
    n = hi - lo
    (w0, c0, p0), (w1, c1, p1) = clocks[lo], clocks[hi]
    return {"workers": n_workers, "chunks": count[0], "measured_chunks": n, "status": summary.status,
            "global_step": summary.global_step,
            "main_thread_cpu_us": 1e6 * (c1 - c0) / n, "process_cpu_us": 1e6 * (p1 - p0) / n,
            "wall_us": 1e6 * (w1 - w0) / n,
            # main-thread wall time per chunk: the chunk's handling (ray.get of its result, the records, the
            # controller, the next chunk's call), of which the controller's handle() and the run_steps.remote()
            "chunk_back_us": 1e6 * spent["chunk_back"] / n, "controller_us": 1e6 * spent["controller"] / n,
            "submit_us": 1e6 * spent["submit"] / n, "run_s": run_s}


# -- the run --------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=10.0, help="model size in MB (float32)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=1.2, help="seconds each (path, shards, k) runs per round")
    ap.add_argument("--warmup", type=int, default=5, help="steps per worker, path and shard count before measuring")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--coord-workers", default="8,32,64")
    ap.add_argument("--coord-chunks", type=int, default=1000, help="chunks in each coordinator run (in all)")
    ap.add_argument("--coord-rounds", type=int, default=2, help="runs per stub-worker count (interleaved)")
    ap.add_argument("--no-ray-path", action="store_true", help="only the TCP path (and gloo)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were
    t_all = time.perf_counter()
    sizes = tuple(int(k) for k in args.workers.split(","))
    coord_sizes = tuple(int(k) for k in args.coord_workers.split(",") if k)
    numel = int(args.mb * 1e6 / 4)
    paths = ("tcp",) if args.no_ray_path else ("tcp", "ray")
    shard_counts = (1, 2)

    import ray

    from cmdare.cloud.detection import INLINE_OBJECTS
    from cmdare.ps.blocks import Block
    from cmdare.ps.optimizer import OptimizerConfig
    from cmdare.ps.shard import AsyncShardActor, BlockData

    # The actors' classes by reference (``ps_scaling.X``, importable in Ray's workers), as a real worker's are:
    # a class of ``__main__`` would travel by value, and its replies (``StubEval``) with it, each time.
    bench_dir = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [bench_dir, os.environ.get("PYTHONPATH")]))
    import ps_scaling as me

    gloo_sizes = tuple(k for k in sizes if k > 1)
    gloo = me.GlooGroups(max(gloo_sizes), gloo_sizes, numel) if gloo_sizes else None  # before Ray, as ps_datapath
    # worker_niceness 0: Ray's default 15 would leave the measured actors behind everything else on the machine
    start_local_ray(num_cpus=2, _system_config={**INLINE_OBJECTS, "worker_niceness": 0})
    tmp = Path(tempfile.mkdtemp(prefix="cmdare-ps-scaling-"))
    counter = str(tmp / "global-step")
    Path(counter).write_bytes(bytes(8))
    try:
        t_setup = time.perf_counter()
        cfg = OptimizerConfig(lr=0.01, momentum=0.9, weight_decay=1e-4)
        params0 = np.random.default_rng(0).standard_normal(numel).astype(np.float32)

        def shards(s: int) -> list[Any]:
            bounds = np.linspace(0, numel, s + 1).astype(int)
            out = []
            for k in range(s):
                a, b = int(bounds[k]), int(bounds[k + 1])
                shard = ray.remote(AsyncShardActor).options(num_cpus=0).remote(k, cfg)
                shard.load.remote(BlockData((Block(0, 0, "w", a, b - a),), params0[a:b].copy(), np.zeros(b - a,
                                                                                                     np.float32), 0))
                out.append(shard)
            return out

        tcp_shards = {s: shards(s) for s in shard_counts}
        ray_shards = {s: shards(s) for s in shard_counts} if "ray" in paths else {}
        addresses = {s: ray.get([sh.tcp_channel.remote() for sh in group]) for s, group in tcp_shards.items()}
        workers = [ray.remote(me.FlatWorker).options(num_cpus=0).remote(numel, i) for i in range(max(sizes))]
        ray.get([w.connect.remote(addresses, ray_shards) for w in workers])
        ray.get([w.warm.remote(args.warmup) for w in workers])
        setup_s = time.perf_counter() - t_setup

        variants = [(p, s, k) for p in paths for s in shard_counts for k in sizes]
        variants += [("gloo", 0, k) for k in gloo_sizes]
        if gloo is not None:
            for k in gloo_sizes:
                gloo.run(k, 3)  # warm-up
        rates: dict[tuple, list[float]] = {v: [] for v in variants}
        steps_ms: dict[tuple, list[float]] = {v: [] for v in variants}
        t_a = time.perf_counter()
        for r in range(args.rounds):
            turn = r * 3 % len(variants)
            for v in variants[turn:] + variants[:turn]:
                path, s, k = v
                if path == "gloo":
                    ts = gloo.run(k, max(3, int(args.window / (0.012 * k))))  # about a window's worth
                    rates[v].append(k / statistics.median(ts))
                    steps_ms[v].extend(t * 1e3 for t in ts)
                    continue
                start_at = time.time() + 0.3
                per_worker = ray.get([w.run.remote(path, s, start_at, args.window) for w in workers[:k]])
                rates[v].append(sum(len(ts) for ts in per_worker) / args.window)
                steps_ms[v].extend(t * 1e3 for ts in per_worker for t in ts)
        data_path_s = time.perf_counter() - t_a
        assert all(ray.get([w.params_finite.remote() for w in workers]))
        for handle in workers + [sh for g in (*tcp_shards.values(), *ray_shards.values()) for sh in g]:
            ray.kill(handle)
        if gloo is not None:
            gloo.close()
            gloo = None

        coordinator = {}
        t_b = time.perf_counter()
        stub_class = ray.remote(me.StubWorker).options(num_cpus=0)
        stubs = [stub_class.remote(counter) for _ in range(max(coord_sizes, default=0))]
        ray.get([s.ready.remote() for s in stubs])
        stubs_setup_s = time.perf_counter() - t_b
        pool = me.StubPool(stubs)
        runs: dict[int, list[dict]] = {n: [] for n in coord_sizes}
        for r in range(args.coord_rounds):  # the sizes interleaved, order rotated
            for n in coord_sizes[r % len(coord_sizes):] + coord_sizes[:r % len(coord_sizes)]:
                runs[n].append(me.coordinator_run(n, args.coord_chunks, pool, counter, tmp))
        for n, rs in runs.items():
            keys = [k for k, v in rs[0].items() if k.endswith("_us")]
            coordinator[str(n)] = {**{k: statistics.median(r[k] for r in rs) for k in keys},
                                   "main_thread_cpu_us_runs": [round(r["main_thread_cpu_us"]) for r in rs],
                                   "measured_chunks": [r["measured_chunks"] for r in rs],
                                   "finished": all(r["status"] == "finished" for r in rs),
                                   "run_s": [round(r["run_s"], 1) for r in rs]}
        coordinator_s = time.perf_counter() - t_b - stubs_setup_s
    finally:
        if gloo is not None:
            gloo.close()
        ray.shutdown()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    mb = args.mb

    def table(path: str, values: dict[tuple, list[float]], fn) -> dict[str, dict[str, float]]:
        return {f"{s}_shard{'s' * (s > 1)}": {str(k): round(fn(values[(path, s, k)]), 2) for k in sizes}
                for s in shard_counts}

    result: dict[str, Any] = {
        "benchmark": "ps_scaling",
        "cluster": "single-node Ray on 127.0.0.1: workers reach the shards over their TCP channels on loopback "
                   "(tcp) or through Ray's object store (ray: same-node objects, a lower bound of the cross-node "
                   "Ray path)",
        "cpu_bound": f"all on {os.cpu_count()} cores: k workers, the shards, Ray and gloo share them; aggregate "
                     "rates show how the cost grows, not what separate machines would reach",
        "model_mb": mb,
        "push_pulls_per_s": {p: table(p, rates, statistics.median) for p in paths},
        "shard_gb_per_s": {p: {key: {k: round(2 * mb * v / 1e3, 2) for k, v in row.items()}
                               for key, row in table(p, rates, statistics.median).items()} for p in paths},
        "step_ms_median": {p: table(p, steps_ms, statistics.median) for p in paths},
        "rate_spread": {p: table(p, rates, lambda v: (max(v) - min(v)) / max(statistics.median(v), 1e-9))
                        for p in paths},
        "gloo": {"allreduce_ms": {str(k): round(statistics.median(steps_ms[("gloo", 0, k)]), 2) for k in gloo_sizes},
                 "exchanges_per_s": {str(k): round(statistics.median(rates[("gloo", 0, k)]), 2) for k in gloo_sizes}},
        "coordinator_us_per_chunk": {n: round(c["main_thread_cpu_us"]) for n, c in coordinator.items()},
        "coordinator": {n: {k: round(v) if k.endswith("_us") else v for k, v in c.items()}
                        for n, c in coordinator.items()},
        "rounds": args.rounds,
        "window_s": args.window,
        "setup_s": round(setup_s, 1),
        "stubs_setup_s": round(stubs_setup_s, 1),
        "data_path_s": round(data_path_s, 1),
        "coordinator_s": round(coordinator_s, 1),
        "wall_s": round(time.perf_counter() - t_all, 1),
    }
    tcp1 = result["push_pulls_per_s"]["tcp"]["1_shard"]
    result["tcp_1_shard_scaling_vs_k1"] = {k: round(v / tcp1[str(sizes[0])], 2) for k, v in tcp1.items()}
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
