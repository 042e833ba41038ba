"""A small pure-Python simulator of parameter-shard load, to test placements and the balancer.

Synchronous training: each step every worker pushes to every non-empty shard; a shard serves its
pushes one after another, and every worker waits for the slowest shard, so

    step_s = compute_s + max_s(workers * push_time_s(shard s))
    push_time_s = per_push_s + per_block_s * blocks + per_byte_s * held_bytes   (times noise)

A straggler is a shard with a larger ``per_byte_s`` (a per-byte delay, as in cmdare's injection).
Every ``window_steps`` steps the simulator hands the balancer one :class:`ShardLoad` per shard,
carries out its decisions (charging a migration pause of ``migration_fixed_s +
migration_s_per_byte * bytes``) and reports the pause back, as the real controller would.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cmdare.ps.blocks import ParamInfo, param_infos
from cmdare.ps.placement import Placement
from cmdare.ps.psld.balancer import PsldBalancer
from cmdare.ps.psld.decisions import AddShard, Decision, Move, NoChange, RemoveShard, moved_bytes
from cmdare.ps.psld.load import ShardLoad

__all__ = ["STATIC_PLACEMENTS", "SimResult", "SimShard", "load_ratio", "resnet32_params", "simulate", "static_step_s",
           "straggler_comparison"]


@dataclass(frozen=True)
class SimShard:
    """A simulated shard's costs (defaults: ~1 GB/s per push, 0.2 ms fixed per push)."""

    per_byte_s: float = 1e-9
    per_push_s: float = 2e-4
    per_block_s: float = 5e-7  # blocks share one flat buffer per shard: only slicing costs per block

    def push_time_s(self, held_bytes: int, blocks: int) -> float:
        """Seconds to serve one push of ``held_bytes`` in ``blocks`` blocks (0 when empty)."""
        if blocks == 0:
            return 0.0
        return self.per_push_s + self.per_block_s * blocks + self.per_byte_s * held_bytes

    def slowed(self, factor: float) -> SimShard:
        """This shard with its per-byte cost multiplied by ``factor`` (a straggler)."""
        return replace(self, per_byte_s=self.per_byte_s * factor)


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated run."""

    total_s: float  # simulated wall time, migration pauses included
    step_times_s: tuple[float, ...]
    migration_pause_s: float
    moves: int
    decisions: tuple[tuple[int, Decision], ...]  # (global step, decision), NoChange left out
    final_placement: Placement
    shards: tuple[SimShard, ...]  # the shards at the end (elastic runs add and remove)
    load_ratio_start: float
    load_ratio_end: float

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    def mean_step_s(self, last_fraction: float = 1.0) -> float:
        """Mean step time over the last ``last_fraction`` of the run (steady state when < 1)."""
        n = max(1, int(round(self.steps * last_fraction)))
        return statistics.fmean(self.step_times_s[-n:])

    @property
    def last_move_step(self) -> int:
        """Global step of the last move or scaling decision (0 if none)."""
        return max((s for s, d in self.decisions if not isinstance(d, NoChange)), default=0)


def _shard_usage(placement: Placement) -> tuple[list[int], list[int]]:
    counts = [0] * placement.num_shards
    for s in placement.shard_of:
        counts[s] += 1
    return placement.shard_bytes(), counts


def static_step_s(placement: Placement, shards: Sequence[SimShard], *, workers: int = 1,
                  compute_s: float = 0.0) -> float:
    """Noise-free step time of ``placement`` on ``shards``."""
    held, counts = _shard_usage(placement)
    return compute_s + workers * max(sh.push_time_s(h, n) for sh, h, n in zip(shards, held, counts, strict=True))


def load_ratio(placement: Placement, shards: Sequence[SimShard]) -> float:
    """Noise-free max/mean time per push over the non-empty shards (1.0: perfectly balanced)."""
    held, counts = _shard_usage(placement)
    times = [sh.push_time_s(h, n) for sh, h, n in zip(shards, held, counts, strict=True) if n]
    return max(times) / statistics.fmean(times)


def simulate(placement: Placement, shards: Sequence[SimShard], steps: int, *,
             balancer: PsldBalancer | None = None, window_steps: int = 10, workers: int = 1,
             compute_s: float = 0.0, noise: float = 0.05, migration_fixed_s: float = 1e-3,
             migration_s_per_byte: float = 2e-9, new_shard: SimShard | None = None,
             changes: Sequence[tuple[int, int, SimShard]] = (), seed: int = 0) -> SimResult:
    """Run ``steps`` synchronous steps; with a ``balancer`` it observes, decides and migrates.

    Args:
        placement: the starting placement (the balancer's own placement is used when given).
        shards: one :class:`SimShard` per shard of the placement.
        steps: steps to simulate.
        balancer: the PSLD balancer, or None for a static placement.
        window_steps: steps per measurement window.
        workers: pushes each shard serves per step.
        compute_s: worker compute time per step.
        noise: relative standard deviation of each push time.
        migration_fixed_s, migration_s_per_byte: the pause a batch of moves causes.
        new_shard: costs of a shard added by the balancer (default ``SimShard()``).
        changes: ``(step, shard, SimShard)``: from ``step`` on, ``shard`` has new costs (e.g. it slows).
        seed: noise seed.
    """
    if len(shards) != placement.num_shards:
        raise ValueError(f"{len(shards)} shard models for {placement.num_shards} shards")
    rng = random.Random(seed)
    shards = list(shards)
    placement = balancer.placement if balancer is not None else placement
    ratio_start = load_ratio(placement, shards)
    held, counts = _shard_usage(placement)
    step_times: list[float] = []
    log: list[tuple[int, Decision]] = []
    pause_total, moves = 0.0, 0
    win = _Window(len(shards))
    pending = {}
    for at, shard, model in changes:
        pending.setdefault(at, []).append((shard, model))
    for step in range(1, steps + 1):
        for shard, model in pending.get(step, ()):
            shards[shard] = model
        times = [sh.push_time_s(h, n) * max(0.2, rng.gauss(1.0, noise))
                 for sh, h, n in zip(shards, held, counts, strict=True)]
        step_s = compute_s + workers * max(times)
        step_times.append(step_s)
        win.add(times, held, workers, step_s)
        if balancer is None or step % window_steps:
            continue
        balancer.observe(win.loads(), step)
        win = _Window(len(shards))
        decisions = [d for d in balancer.decide(step) if not isinstance(d, NoChange)]
        if not decisions:
            continue
        nbytes = moved_bytes(placement, decisions)
        pause_s = migration_fixed_s + migration_s_per_byte * nbytes
        for d in decisions:
            log.append((step, d))
            if isinstance(d, AddShard):
                shards.append(new_shard or SimShard())
            elif isinstance(d, RemoveShard):
                del shards[d.shard_id]
        moves += sum(isinstance(d, Move) for d in decisions)
        placement = balancer.apply(decisions)
        balancer.observe_migration(nbytes, pause_s)
        pause_total += pause_s
        held, counts = _shard_usage(placement)
        win = _Window(len(shards))
    return SimResult(sum(step_times) + pause_total, tuple(step_times), pause_total, moves, tuple(log),
                     placement, tuple(shards), ratio_start, load_ratio(placement, shards))


class _Window:
    """Per-shard sums over one measurement window."""

    def __init__(self, n: int):
        self.busy = [0.0] * n
        self.queue = [0.0] * n
        self.bytes = [0] * n
        self.pushes = [0] * n
        self.window_s = 0.0

    def add(self, times: Sequence[float], held: Sequence[int], workers: int, step_s: float) -> None:
        self.window_s += step_s
        for s, t in enumerate(times):
            if t <= 0:
                continue
            self.busy[s] += workers * t
            self.queue[s] += t * workers * (workers - 1) / 2  # pushes served one after another
            self.bytes[s] += workers * held[s]
            self.pushes[s] += workers

    def loads(self) -> list[ShardLoad]:
        return [ShardLoad(s, self.window_s, self.pushes[s], self.bytes[s], self.bytes[s], self.busy[s],
                          0.6 * self.busy[s], self.queue[s], self.queue[s] + self.busy[s])
                for s in range(len(self.busy))]


def resnet32_params(num_classes: int = 10) -> list[ParamInfo]:
    """Parameter shapes of a CIFAR ResNet-32 (widths 16/32/64, 5 blocks per stage, 1x1 projection
    shortcuts), in ``named_parameters`` order: 0.47M parameters, tensors of 10 to 36,864 elements."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("conv1.weight", (16, 3, 3, 3)), ("bn1.weight", (16,)),
                                                 ("bn1.bias", (16,))]
    cin = 16
    for stage, width in enumerate((16, 32, 64), start=1):
        for block in range(5):
            pre = f"layer{stage}.{block}"
            shapes += [(f"{pre}.conv1.weight", (width, cin, 3, 3)), (f"{pre}.bn1.weight", (width,)),
                       (f"{pre}.bn1.bias", (width,)), (f"{pre}.conv2.weight", (width, width, 3, 3)),
                       (f"{pre}.bn2.weight", (width,)), (f"{pre}.bn2.bias", (width,))]
            if cin != width:
                shapes += [(f"{pre}.shortcut.0.weight", (width, cin, 1, 1)),
                           (f"{pre}.shortcut.1.weight", (width,)), (f"{pre}.shortcut.1.bias", (width,))]
            cin = width
    shapes += [("fc.weight", (num_classes, 64)), ("fc.bias", (num_classes,))]
    return param_infos(shapes)


STATIC_PLACEMENTS = ("round-robin", "greedy", "mxnet", "byteps")


def straggler_comparison(params: Sequence[ParamInfo], num_shards: int, *, slow_factor: float = 3.0,
                         slow_at: int | None = 0, steps: int = 2000, seed: int = 0,
                         **balancer_kw: object) -> dict[str, object]:
    """Simulated step times of every static placement and of PSLD, one shard slowed by ``slow_factor``.

    Static placements run ``steps // 2`` steps (they do not change); PSLD runs ``steps`` steps from
    the ``psld`` placement and is charged its convergence and migration pauses (whole-run mean).

    Returns:
        A JSON-ready dict: ``static_step_s`` by name, ``best_static``, ``psld_step_s``,
        ``speedup_vs_best_static``, ``load_ratio_before``/``after`` (PSLD's max/mean shard time), moves.
    """
    from cmdare.ps.placement import get_placement

    shards = [SimShard().slowed(slow_factor) if i == slow_at else SimShard() for i in range(num_shards)]
    static = {name: simulate(get_placement(name).place(params, num_shards), shards, max(1, steps // 2),
                             seed=seed + 1).mean_step_s() for name in STATIC_PLACEMENTS}
    best = min(static, key=static.__getitem__)
    pl = get_placement("psld").place(params, num_shards)
    kw = {"interval_steps": 20, **balancer_kw}
    run = simulate(pl, shards, steps, balancer=PsldBalancer(num_shards, pl, **kw), seed=seed + 2)  # type: ignore[arg-type]
    psld_s = run.total_s / run.steps
    return {"num_shards": num_shards, "slow_factor": slow_factor, "slow_at": slow_at,
            "static_step_s": static, "best_static": best, "psld_step_s": psld_s,
            "speedup_vs_best_static": static[best] / psld_s, "load_ratio_before": run.load_ratio_start,
            "load_ratio_after": run.load_ratio_end, "moves": run.moves,
            "migration_pause_s": run.migration_pause_s, "last_move_step": run.last_move_step}
