"""Cross-node PS data path: push + pull of a 10 MB model between two real Ray nodes, over the shard's TCP channel.

A two-node ``ray start`` cluster inside a loopback-only network namespace (``tests/multinode/netns_cluster.py``,
as the multi-node tests build it): a head with ``cmdare_ps`` holding the shards, one node with ``cmdare_worker``
holding the worker actor; this script re-runs itself inside the namespace as the driver (``nsenter``). Every
byte between the nodes crosses TCP on the namespace's 127.0.0.1, like two hosts on one link of the machine's
loopback speed. Variants, interleaved round by round (order rotated) after a warm-up; medians:

* ``cross_node``: the worker actor pushes a 10 MB gradient to a real :class:`cmdare.ps.shard.AsyncShardActor`
  (one block, momentum SGD) over the shard's TCP channel (``shard.tcp_channel.remote()`` once, then a
  :class:`cmdare.ps.tcp_channel.TcpChannelClient` over the worker's flat buffers) and receives its parameters
  in the same exchange; timed in the worker actor, send to the end of the reply.
* ``ray_path``: the same worker actor calls ``push_pull.remote(grad, step, sent_at, sender)`` on a second
  shard actor (no channel open, as ``Worker._push_ref``) and copies the returned parameters into its flat
  buffer (``FlatLayout.set_shard_params``): the gradient and the parameters cross as Ray objects.
* ``gloo``: ``torch.distributed.all_reduce`` of the same 10 MB between 2 processes, gloo over TCP on
  127.0.0.1 in the namespace (``ps_datapath.Gloo``: time on rank 0).

``parts_ms`` says what limits ``cross_node``: ``carrier`` is the same exchange with a session that does nothing (a
TCP channel server on the head whose push returns at once: the carrier's floor on this machine); ``raw_one_way`` is
10 MB sent one way on a plain socket between the nodes and a 1-byte answer (``loopback_gb_per_s``);
``raw_round_trip`` the same 10 MB sent there and back on a plain socket: the floor of any push and pull on this
machine, with ``ratio_raw_round_trip_vs_gloo``; ``cross_node_in_pieces`` is ``cross_node`` with the gradient sent
as ``--pieces`` pieces before the push, as a worker sends a large shard's gradient during backward (the shard
applies each on arrival and streams its parameters straight back while the next piece comes; also at the top level
as ``cross_node_pieces_ms`` with its ratio to gloo); ``shard_update`` the shard's momentum update per push (from
its own ``stats``, the pieces' pushes included); ``rpc`` an empty Ray call from the worker node to the shard;
``copyto`` one 10 MB ``np.copyto``.

Targets (issue): ratio_cross_node_vs_gloo <= 0.8, ratio_cross_node_vs_ray_path <= 0.5, at 10 MB steady state.

Usage: .venv/bin/python bench/cross_node.py [--mb 10] [--rounds 10] [--iters 20] [--warmup 40] [--pieces 4]
Prints one JSON object as its last line (``skipped`` with the reason where network namespaces are not allowed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from cmdare.train.run.ray_session import ensure_ray  # before Ray is imported: Ray on 127.0.0.1
from cmdare.train.workers.overlap import PIECES_PER_SHARD

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("cross_node", "ray_path", "gloo")
PARTS = ("part_carrier", "part_raw_one_way", "part_raw_round_trip", "part_pieces", "part_rpc", "part_copyto")
TARGET_VS_GLOO, TARGET_VS_RAY_PATH = 0.8, 0.5


# -- actors (defined here, shipped to the nodes by Ray) -------------------------------------------------------

class _NoUpdate:
    """A session whose push does nothing: the TCP carrier alone."""

    def __init__(self, grad: np.ndarray, out: np.ndarray):
        self.grad, self.out = grad, out

    def piece(self, offset, count, pulled_step, sender) -> None:
        pass

    def push(self, pulled_step, sent_at, sender, sent) -> tuple[int, bool]:
        return 1, True

    def close(self) -> None:
        pass


class Floor:
    """On the shard's node: a TCP channel server with :class:`_NoUpdate` sessions, and a plain socket that
    takes ``numel`` float32 and answers 1 byte (the loopback's one-way speed), or answers ``numel`` float32 (a
    round trip of the exchange's bytes with no protocol and no update: the floor of any push and pull)."""

    def __init__(self, numel: int):
        import ray

        from cmdare.ps.tcp_channel import TcpChannelServer

        host = ray.util.get_node_ip_address()
        self.server = TcpChannelServer(_NoUpdate, host)
        self.raw = socket.socket()
        self.raw.bind((host, 0))
        self.raw.listen(4)
        self.numel = numel
        threading.Thread(target=self._raw, daemon=True).start()

    def addresses(self):
        return self.server.address, self.raw.getsockname()

    def _raw(self) -> None:
        while True:
            try:
                conn, _ = self.raw.accept()
            except OSError:
                return
            threading.Thread(target=self._raw_peer, args=(conn,), daemon=True).start()

    def _raw_peer(self, conn: socket.socket) -> None:
        from cmdare.ps.stream_io import recv_into_exact, send_all

        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = np.empty(self.numel, np.float32)
        with contextlib.suppress(OSError):
            echo = conn.recv(1) == b"e"  # this connection's mode: echo the values, or answer 1 byte
            while True:
                recv_into_exact(conn, buf)
                send_all(conn, [buf] if echo else [b"k"])


class Probe:
    """The worker on the other node: its flat gradient and parameter buffers, and the timed exchanges."""

    def __init__(self, numel: int, seed: int):
        rng = np.random.default_rng(seed)
        self.grad = (rng.standard_normal(numel) * 1e-3).astype(np.float32)  # as backward leaves it
        self.params = np.zeros(numel, np.float32)  # the worker's host flat buffer
        self.spare = np.zeros(numel, np.float32)
        self.step = 0

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def connect(self, shard_address, carrier_address, raw_address) -> None:
        from cmdare.ps.tcp_channel import TcpChannelClient

        self.tcp = TcpChannelClient(shard_address, self.params, self.grad, timeout=10.0)
        self.carrier = TcpChannelClient(carrier_address, self.spare, self.grad, timeout=10.0)
        self.raw, self.echo = (socket.create_connection(tuple(raw_address), timeout=10.0) for _ in range(2))
        for sock, mode in ((self.raw, b"1"), (self.echo, b"e")):
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(mode)

    @staticmethod
    def _timed(fn, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    def cross_node(self, n: int) -> list[float]:
        def one() -> None:
            self.tcp.send(self.step, time.time(), 0)
            self.step, _ = self.tcp.receive()

        return self._timed(one, n)

    def cross_node_pieces(self, n: int, pieces: int) -> list[float]:
        bounds = np.linspace(0, self.grad.size, pieces + 1).astype(int)

        def one() -> None:
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                self.tcp.send_piece(int(lo), int(hi - lo), self.step, 0)
            self.tcp.send(self.step, time.time(), 0, sent=self.grad.size)
            self.step, _ = self.tcp.receive()

        return self._timed(one, n)

    def ray_path(self, shard, n: int) -> list[float]:
        import ray

        def one() -> None:
            values, self.step, _ = ray.get(shard.push_pull.remote(self.grad, self.step, time.time(), 0))
            np.copyto(self.params, values)  # FlatLayout.set_shard_params

        return self._timed(one, n)

    def carrier_only(self, n: int) -> list[float]:
        def one() -> None:
            self.carrier.send(None, None, 0)
            self.carrier.receive()

        return self._timed(one, n)

    def raw_one_way(self, n: int) -> list[float]:
        view = memoryview(self.grad).cast("B")

        def one() -> None:
            self.raw.sendall(view)
            if self.raw.recv(1) != b"k":
                raise ConnectionError("raw peer closed")

        return self._timed(one, n)

    def raw_round_trip(self, n: int) -> list[float]:
        from cmdare.ps.stream_io import recv_into_exact

        view = memoryview(self.grad).cast("B")

        def one() -> None:
            self.echo.sendall(view)
            recv_into_exact(self.echo, self.spare)

        return self._timed(one, n)

    def rpc(self, shard, n: int) -> list[float]:
        import ray

        return self._timed(lambda: ray.get(shard.ping.remote()), n)

    def copyto(self, n: int) -> list[float]:
        return self._timed(lambda: np.copyto(self.spare, self.grad), n)

    def params_finite(self) -> bool:
        return bool(np.isfinite(self.params).all() and self.params.any())


# -- the driver, inside the namespace -----------------------------------------------------------------------

def inner(args: argparse.Namespace) -> dict:
    import ray

    from cmdare.ps.blocks import Block
    from cmdare.ps.optimizer import OptimizerConfig
    from cmdare.ps.shard import AsyncShardActor, BlockData
    from ps_datapath import Gloo

    numel = int(args.mb * 1e6 / 4)
    cfg = OptimizerConfig(lr=0.01, momentum=0.9, weight_decay=1e-4)
    params0 = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
    gloo = Gloo(numel)  # before Ray, so the children do not inherit Ray's state
    ensure_ray(args.address)
    try:
        on_ps, on_worker = {"resources": {"cmdare_ps": 1}}, {"resources": {"cmdare_worker": 1}}
        shard_tcp, shard_ray = (ray.remote(AsyncShardActor).options(num_cpus=0, **on_ps).remote(0, cfg)
                                for _ in range(2))
        blocks = tuple(Block(i, 0, "w", lo, min(numel, lo + numel // args.blocks + 1) - lo)
                       for i, lo in enumerate(range(0, numel, numel // args.blocks + 1)))
        ray.get([s.load.remote(BlockData(blocks, params0, np.zeros_like(params0), 0)) for s in (shard_tcp, shard_ray)])
        floor = ray.remote(Floor).options(num_cpus=0, **on_ps).remote(numel)
        probe = ray.remote(Probe).options(num_cpus=0, **on_worker).remote(numel, 1)
        address = ray.get(shard_tcp.tcp_channel.remote())
        if address is None:
            raise RuntimeError("the shard's TCP channel is off (CMDARE_TCP=0)")
        carrier_address, raw_address = ray.get(floor.addresses.remote())
        ray.get(probe.connect.remote(address, carrier_address, raw_address))
        nodes = {"shard": ray.get(shard_tcp.node_id.remote()), "worker": ray.get(probe.node_id.remote())}
        if nodes["shard"] == nodes["worker"]:
            raise RuntimeError(f"the shard and the worker share a node: {nodes}")

        calls = {"cross_node": lambda n: ray.get(probe.cross_node.remote(n)),
                 "ray_path": lambda n: ray.get(probe.ray_path.remote(shard_ray, n)),
                 "gloo": gloo.run,
                 "part_carrier": lambda n: ray.get(probe.carrier_only.remote(n)),
                 "part_raw_one_way": lambda n: ray.get(probe.raw_one_way.remote(n)),
                 "part_raw_round_trip": lambda n: ray.get(probe.raw_round_trip.remote(n)),
                 "part_pieces": lambda n: ray.get(probe.cross_node_pieces.remote(n, args.pieces)),
                 "part_rpc": lambda n: ray.get(probe.rpc.remote(shard_tcp, n)),
                 "part_copyto": lambda n: ray.get(probe.copyto.remote(n))}
        parts = tuple(p for p in PARTS if p != "part_pieces" or args.pieces > 0)
        t_start = time.perf_counter()
        for name in VARIANTS + parts:  # warm-up: the first tens of calls are several times slower
            calls[name](args.warmup)
        ray.get([s.stats.remote(reset=True) for s in (shard_tcp, shard_ray)])
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS + parts}
        round_medians: dict[str, list[float]] = {v: [] for v in VARIANTS + parts}
        for r in range(args.rounds):
            turn = r % len(VARIANTS)
            for name in VARIANTS[turn:] + VARIANTS[:turn] + parts:  # rotate the order each round
                ts = calls[name](args.iters)
                samples[name].extend(ts)
                round_medians[name].append(statistics.median(ts))
        wall_s = time.perf_counter() - t_start
        stats = dict(zip(("tcp", "ray"), ray.get([s.stats.remote(reset=True) for s in (shard_tcp, shard_ray)]),
                         strict=True))
        assert ray.get(probe.params_finite.remote())  # the shard's parameters landed in the worker's buffer
    finally:
        gloo.close()
        ray.shutdown()

    med = {v: statistics.median(samples[v]) * 1e3 if samples.get(v) else math.nan for v in VARIANTS + PARTS}
    update_ms = {k: 1e3 * s.apply_s / max(1, s.pushes) for k, s in stats.items()}
    result = {
        "benchmark": "cross_node",
        "cluster": "2 ray start nodes (head: shards; node: worker actor) in a loopback-only network namespace",
        "model_mb": args.mb,
        "numel": numel,
        "shard_blocks": len(blocks),
        "cross_node_ms": round(med["cross_node"], 3),
        "ray_path_ms": round(med["ray_path"], 3),
        "gloo_ms": round(med["gloo"], 3),
        "ratio_cross_node_vs_gloo": round(med["cross_node"] / med["gloo"], 3),
        "ratio_cross_node_vs_ray_path": round(med["cross_node"] / med["ray_path"], 3),
        "cross_node_pieces_ms": round(med["part_pieces"], 3) if args.pieces > 0 else None,
        "ratio_cross_node_pieces_vs_gloo": round(med["part_pieces"] / med["gloo"], 3) if args.pieces > 0 else None,
        "target_vs_gloo": TARGET_VS_GLOO,
        "target_vs_ray_path": TARGET_VS_RAY_PATH,
        "parts_ms": {"carrier": round(med["part_carrier"], 3), "raw_one_way": round(med["part_raw_one_way"], 3),
                     "raw_round_trip": round(med["part_raw_round_trip"], 3),
                     "cross_node_in_pieces": round(med["part_pieces"], 3) if args.pieces > 0 else None,
                     "shard_update": round(update_ms["tcp"], 3), "shard_update_ray_path": round(update_ms["ray"], 3),
                     "rpc": round(med["part_rpc"], 3), "copyto": round(med["part_copyto"], 3)},
        "loopback_gb_per_s": round(args.mb / 1e3 / (med["part_raw_one_way"] / 1e3), 2),
        # the exchange's bytes there and back on a plain socket, against gloo: no push + pull can go below it
        "ratio_raw_round_trip_vs_gloo": round(med["part_raw_round_trip"] / med["gloo"], 3),
        # what cross_node costs beyond the carrier's floor (the shard's update, its lock, its session)
        "cross_node_minus_carrier_ms": round(med["cross_node"] - med["part_carrier"], 3),
        "round_median_spread_ms": {v: [round(min(m) * 1e3, 3), round(max(m) * 1e3, 3)]
                                   for v, m in round_medians.items()},
        "p90_ms": {v: round(float(np.percentile(samples[v], 90)) * 1e3, 3) for v in VARIANTS},
        "samples_per_variant": args.rounds * args.iters,
        "shard_pushes": {k: s.pushes for k, s in stats.items()},
        "wall_s": round(wall_s, 1),
    }
    result["met"] = {"gloo": result["ratio_cross_node_vs_gloo"] <= TARGET_VS_GLOO,
                     "ray_path": result["ratio_cross_node_vs_ray_path"] <= TARGET_VS_RAY_PATH}
    return result


# -- the host side: the namespace, the cluster, the driver ----------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=10.0, help="model size in MB (float32)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20, help="calls per variant per round")
    ap.add_argument("--warmup", type=int, default=40, help="calls per variant before measuring")
    ap.add_argument("--blocks", type=int, default=1, help="blocks the shard holds the model in")
    ap.add_argument("--pieces", type=int, default=PIECES_PER_SHARD,
                    help="pieces of the gradient in cross_node_pieces_ms (0: leave it out); default: a worker's")
    ap.add_argument("--address", help=argparse.SUPPRESS)  # set when run as the driver inside the namespace
    args = ap.parse_args()
    if args.address:
        print(json.dumps(inner(args)))
        return
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were
    sys.path.insert(0, str(ROOT / "tests" / "multinode"))
    from netns_cluster import PYTHON, NetnsCluster, netns_available

    reason = netns_available()
    if reason:
        print(json.dumps({"benchmark": "cross_node", "skipped": True, "reason": reason}))
        return
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="cmdare-cross-node-"))
    # Ray starts its worker processes at niceness 15 by default: on a shared machine the actors measured here
    # would wait behind everything else (cmdare train sets 0 for the instance it starts; so does this bench).
    env = {"RAY_worker_niceness": "0"}
    try:
        with NetnsCluster(tmp) as cluster:
            cluster.start_cluster(workers=1, head_cpus=2, ps_slots=4, node_cpus=1, env=env)
            setup_s = time.perf_counter() - t0
            argv = [PYTHON, str(Path(__file__).resolve()), "--address", cluster.address, "--mb", str(args.mb),
                    "--rounds", str(args.rounds), "--iters", str(args.iters), "--warmup", str(args.warmup),
                    "--blocks", str(args.blocks), "--pieces", str(args.pieces)]
            proc = cluster.run(argv, env={**env, "CMDARE_HOME": str(tmp / "driver")}, timeout=600)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"the driver in the namespace failed (rc={proc.returncode}):\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{cluster.logs_tail()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = json.loads(lines[-1])
    result["setup_s"] = round(setup_s, 1)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    result["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
