"""The planner's simulator against a real local cmdare run under injected revocations (issue 7).

One real run: ``W`` emulated transient workers + 1 PS on the local Ray node, revocations injected by
an exponential lifetime model (mean ``--lifetime-mean-s``, saved as a model file and passed as
``lifetime=FILE,speedup=1,seed=N``) or every ``--every-s`` s (``every=S,first=F,seed=N``),
replacement ``same`` after a fixed emulated start-up delay (``startup=S``). From the run's own
reports we measure:

* the training wall time: start of the first chunk to the report that reaches the target step
  (Ray and actor start-up excluded, like the simulator's t=0);
* the cluster speed per live-worker count (global steps over time in the intervals with that many
  workers live): on 2 shared cores W workers are not W x one worker, so the simulator gets the table;
* the replacement delay actually observed (``replacement_joined.recovery_s``: revocation to the
  replacement's first chunk: detection + emulated start-up + actor start + first pull).

Then the same job is simulated through :mod:`cmdare.plan` with :mod:`cmdare.plan.replay` models:

* ``replay``: the real run's own revocation schedule (:class:`ScriptedLifetimes`) and replacement
  delays, one deterministic run;
* ``sim``: ``--runs`` seeded runs (mean, P50, P95) - the issue's comparison. Lifetime mode: plain
  draws from the same lifetime model (:class:`ModelLifetimes`); periodic mode: the control kernel's
  own :class:`~cmdare.control.PeriodicRevocations` (``Simulator(..., revocations=factory)``, one
  seeded source per run). No hand correction of the lifetime clock (``"hand_correction": false``).

Lifetime clocks. Both drivers count a server's lifetime from its ``ready_at`` and revoke only
workers that trained (an overdue one goes at its first step), but "ready" is not the same moment:

* a replacement: in the engine its server is ready after detection + the emulated start-up, and its
  worker actor then starts and pulls before its first chunk; in the simulator it is ready when it
  joins, the observed recovery delay after the revocation, which already includes that actor start
  and first pull. The simulator's replacement clock therefore starts later, by the engine's ready to
  first chunk (``replacement_clock_lag_s`` in the JSON, a few seconds here);
* an initial server: the engine sets ``ready_at`` to its request, before Ray starts its actor, so its
  clock runs ``initial_offset_s`` (the run's actor start-up) before the first chunk; the simulator
  counts it from t=0, the first chunk.

Both make the simulated lifetimes a few seconds longer than the engine's (fewer revocations in a
short run); the bench reports the two figures and leaves them uncorrected. The periodic schedule
has no such offset: both count its ticks from the first chunk (the engine's next tick from the
coordinator check that revoked, so its ticks can slip by a chunk; and it picks among workers whose
first chunk has reported, the simulator among those that joined).

``error_pct`` = |sim mean - real| / real. Usage::

    .venv/bin/python bench/sim_vs_real.py [--workers 3] [--steps 2500] [--mode lifetime|every]
        [--lifetime-mean-s 45] [--every-s 10] [--first-s 5] [--startup-s 3] [--seed 7] [--runs 2000]
        [--real-runs 1]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cmdare.train.cluster import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

#: The simulator's worker type for the emulated local workers.
GPU = "local"


@dataclass(frozen=True)
class Revocations:
    """How revocations are injected: ``lifetime`` (exponential, mean ``mean_s``, from each server's
    ready time) or ``every`` (one random training worker every ``every_s`` s, the first ``first_s`` s in)."""

    mode: str = "lifetime"
    mean_s: float = 45.0
    every_s: float = 10.0
    first_s: float = 5.0

    def __post_init__(self) -> None:
        if self.mode not in ("lifetime", "every"):
            raise ValueError(f"unknown revocation mode {self.mode!r}; valid: lifetime, every")


@dataclass
class RealRun:
    """What one real run reported."""

    steps: int
    workers: int
    steps_log: list[tuple[float, int, float]] = field(default_factory=list)  # (time, global_step, duration_s)
    events: list[Any] = field(default_factory=list)
    summary: Any = None


def real_run(steps: int, workers: int, revocations: Revocations, startup_s: float, seed: int,
             workdir: Path, model: str = "resnet8") -> RealRun:
    """One real local cmdare run with injected revocations; Ray is started here (if not running)."""
    import ray

    from cmdare.measure.lifetime_models import ExponentialLifetime
    from cmdare.train import Trainer, TrainSpec
    from cmdare.train.callbacks import TrainCallback

    if revocations.mode == "lifetime":
        model_path = workdir / "lifetime.json"
        model_path.write_text(json.dumps(ExponentialLifetime(revocations.mean_s).to_dict()))
        text = f"lifetime={model_path},speedup=1,seed={seed}"
    else:
        text = f"every={revocations.every_s},first={revocations.first_s},seed={seed}"
    out = RealRun(steps, workers)

    class Recorder(TrainCallback):
        def on_step(self, report):  # noqa: ANN001 - TrainCallback hook
            out.steps_log.append((report.time, report.global_step, report.duration_s))

        def on_event(self, report):  # noqa: ANN001
            out.events.append(report)

    spec = TrainSpec(model=model, dataset="digits", workers=workers, ps=1, steps=steps, batch_size=32,
                     checkpoint_every=0, eval_every=0, seed=seed, transient=True,
                     revocations=text, replace="same",
                     startup=str(startup_s))
    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=6)
    try:
        out.summary = Trainer(spec, [Recorder()], checkpoint_dir=workdir / "ckpt").run()
    finally:
        if started:
            ray.shutdown()
    return out


@dataclass
class Observed:
    """Figures measured from a real run, in seconds since the first chunk started (t0)."""

    wall_s: float
    speed_table: dict[int, float]  # live workers -> cluster steps/s
    time_at_count_s: dict[int, float]
    recovery_s: list[float]
    initial_offset_s: list[float]  # per initial worker: t0 - request (its engine lifetime already spent at t0)
    replacement_clock_lag_s: list[float]  # per replacement: engine ready -> first chunk (simulator's ready)
    script: list[float]  # the run's lifetimes as the simulator counts them, in its draw order
    replay_delays_s: list[float]  # per replacement, in request order: revocation to first chunk
    revocations: int
    startup_s: float  # the RunSummary's Ray + actor start-up, excluded from wall_s
    initial_join_spread_s: float = 0.0  # first step to the last initial worker's first step


def _step_at(log: np.ndarray, t: float) -> float:
    """Global step at time ``t``, interpolated between reports."""
    return float(np.interp(t, log[:, 0], log[:, 1]))


def analyze(run: RealRun) -> Observed:
    """Wall time, per-membership speed, observed delays and the lifetime script of a real run."""
    log = np.array([(t, s) for t, s, _ in run.steps_log], dtype=float)
    t0 = run.steps_log[0][0] - run.steps_log[0][2]
    log = np.vstack([[t0, 0.0], log])
    reached = np.nonzero(log[:, 1] >= run.steps)[0]
    t_end = float(log[reached[0], 0]) if reached.size else float(log[-1, 0])
    ev = run.events
    slot_of: dict[int, int] = {}  # worker id -> slot (initial workers 0..W-1 in order, replacements inherit)
    joined: dict[int, float] = {}
    left: dict[int, float] = {}
    requested: dict[int, float] = {}
    ready: dict[int, float] = {}
    recovery, lag = [], []
    for e in ev:
        d = e.details
        if e.kind == "server_joined" and e.worker_id is not None:
            slot_of.setdefault(e.worker_id, len(slot_of))
            joined[e.worker_id] = d.get("joined_at", e.time)
            requested[e.worker_id] = d["requested_at"]
        elif e.kind == "revocation" and e.worker_id is not None:
            left[e.worker_id] = e.time
        elif e.kind == "replacement_joined":
            slot_of[e.worker_id] = slot_of[d["replaces_worker"]]
            joined[e.worker_id] = d.get("joined_at", e.time)
            recovery.append(d["recovery_s"])
            ready[e.worker_id] = d["requested_at"] + d["startup_s"]
            lag.append(joined[e.worker_id] - ready[e.worker_id])
    # Live-worker count over [t0, t_end]: +1 at a join, -1 at a revocation.
    changes = sorted([(max(t, t0), +1) for t in joined.values()] + [(t, -1) for t in left.values()])
    bounds, counts, live = [t0], [], 0
    for t, delta in changes:
        if t > bounds[-1]:
            counts.append(live)
            bounds.append(min(t, t_end))
        live += delta
    counts.append(live)
    bounds.append(t_end)
    steps_at: dict[int, float] = {}
    time_at: dict[int, float] = {}
    for (a, b), n in zip(zip(bounds[:-1], bounds[1:], strict=True), counts, strict=True):
        if b > a and n > 0:
            steps_at[n] = steps_at.get(n, 0.0) + _step_at(log, b) - _step_at(log, a)
            time_at[n] = time_at.get(n, 0.0) + b - a
    table = {n: steps_at[n] / time_at[n] for n in sorted(time_at) if time_at[n] > 0}
    # Each replacement's delay in request (= revocation) order; one still starting at the end took longer
    # than the rest of the run.
    recovery_of = {e.details["replaces_worker"]: e.details["recovery_s"] for e in ev if e.kind == "replacement_joined"}
    mean_delay = float(np.mean(recovery)) if recovery else 0.0
    replay_delays = [recovery_of.get(w, max(mean_delay, t_end - left[w] + 1.0))
                     for w in sorted(left, key=left.__getitem__)]
    # Lifetimes as the simulator counts them, from each server's ready time there: an initial slot's
    # from t0, a replacement's from its join (the revocation it replaces + that replacement's delay).
    # Never-revoked ones are infinite. The simulator draws _LIFETIMES_PER_SLOT per slot up front
    # (slot-major), further ones on demand when a replacement joins, in join order.
    from cmdare.plan.simulator import _LIFETIMES_PER_SLOT as per

    start = {w: t0 for w in slot_of if w not in ready}
    for e in ev:
        if e.kind == "replacement_joined":
            lost = e.details["replaces_worker"]
            start[e.worker_id] = left[lost] + recovery_of[lost]
    per_slot: dict[int, list[tuple[float, float]]] = {s: [] for s in range(run.workers)}
    for w in sorted(slot_of, key=start.__getitem__):
        life = max(0.0, left[w] - start[w]) if w in left and left[w] <= t_end else np.inf
        per_slot[slot_of[w]].append((start[w], life))
    script: list[float] = []
    extra: list[tuple[float, float]] = []
    for s in range(run.workers):
        lives = per_slot[s]
        script += [life for _, life in lives[:per]] + [np.inf] * max(0, per - len(lives))
        extra += lives[per:]
    script += [life for _, life in sorted(extra)]
    initial_offset = [t0 - requested[w] for w in sorted(requested)]
    return Observed(
        wall_s=t_end - t0, speed_table=table, time_at_count_s=time_at, recovery_s=recovery,
        initial_offset_s=initial_offset, replacement_clock_lag_s=lag, script=script,
        replay_delays_s=replay_delays,
        initial_join_spread_s=max(joined[w] for w in requested) - t0 if requested else 0.0,
        revocations=len(left), startup_s=float(run.summary.details["startup_s"]) if run.summary else 0.0)


class ScriptedStartup:
    """The observed replacement delays, in request order (then their mean)."""

    def __init__(self, delays_s: list[float]):
        self.queue = list(delays_s)
        self.mean_s = float(np.mean(delays_s)) if delays_s else 0.0

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        """The next observed delay."""
        return self.queue.pop(0) if self.queue else self.mean_s


class TableSpeed:
    """Cluster speed by live-worker count, as measured. A count the run never had: below the smallest
    measured one, that speed scaled by the worker ratio; above the largest, the largest's speed (the
    cores are saturated: on 2 shared cores more workers do not add speed)."""

    def __init__(self, table: dict[int, float]):
        if not table:
            raise ValueError("empty speed table")
        self.table = dict(table)

    def cluster_steps_per_s(self, gpus: dict[str, int], ps: int) -> float:
        """Measured cluster speed for the live count."""
        n = sum(gpus.values())
        if n in self.table:
            return self.table[n]
        lo, hi = min(self.table), max(self.table)
        if n > hi:
            return self.table[hi]
        if n < lo:
            return self.table[lo] * n / lo
        below, above = max(k for k in self.table if k < n), min(k for k in self.table if k > n)
        return float(np.interp(n, [below, above], [self.table[below], self.table[above]]))

    def worker_steps_per_s(self, gpu: str) -> float:
        """Mean share of one worker in the largest measured membership."""
        n = max(self.table)
        return self.table[n] / n


class ModelLifetimes:
    """A :mod:`cmdare.measure.lifetime_models` model as the simulator's lifetime sampler: plain draws,
    the same model the engine draws from (both count them from the server's ready time)."""

    def __init__(self, model: Any):
        self.model = model

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """``size`` lifetimes from the model."""
        return np.asarray(self.model.sample(rng, size), dtype=float)


def periodic_source(every_s: float, first_s: float, seed: int) -> Callable[[], Any]:
    """A ``Simulator(revocations=...)`` factory for ``every=S,first=F``: the control kernel's
    :class:`~cmdare.control.PeriodicRevocations`, the engine's own source. Each call (one per simulated
    run) gets the next child of ``SeedSequence(seed)`` for its victim picks, so with a fresh factory
    run ``i`` of a ``summarize(runs, seed)`` is the same whatever ``runs`` is."""
    from cmdare.control import PeriodicRevocations

    seeds = np.random.SeedSequence(seed)
    return lambda: PeriodicRevocations(every_s, first_s, np.random.default_rng(seeds.spawn(1)[0]))


def _pool_speed(observed: list[Observed]) -> dict[int, float]:
    """Time-weighted speed per live count over several runs."""
    steps: dict[int, float] = {}
    secs: dict[int, float] = {}
    for o in observed:
        for n, v in o.speed_table.items():
            steps[n] = steps.get(n, 0.0) + v * o.time_at_count_s[n]
            secs[n] = secs.get(n, 0.0) + o.time_at_count_s[n]
    return {n: steps[n] / secs[n] for n in sorted(secs)}


def simulate(observed: list[Observed], workers: int, steps: int, revocations: Revocations, runs: int,
             seed: int) -> tuple[list[float], dict[str, float]]:
    """(replay wall time per real run, Monte Carlo summary) with the observed speeds and delays.

    The replay gives each real run its own revocation schedule and replacement delays (one
    deterministic simulated run each); the Monte Carlo draws revocations from the same lifetime model
    (or the kernel's periodic source) with every measurement pooled over the real runs.
    """
    from cmdare.plan import ClusterSpec, JobSpec, PlanModels, WorkerGroup
    from cmdare.plan.replay import FixedStartup, FlatPrices, ScriptedLifetimes
    from cmdare.plan.simulator import Simulator

    job = JobSpec("local", steps, checkpoint_every_steps=10**9)
    cluster = ClusterSpec((WorkerGroup(GPU, workers, transient=True),), ps=1, replacement="same")
    prices = FlatPrices({GPU: 0.0, "cpu": 0.0})
    replays = []
    for o in observed:
        models = PlanModels(TableSpeed(o.speed_table), ScriptedLifetimes({GPU: o.script}),
                            ScriptedStartup(o.replay_delays_s), prices, checkpoint_s=0.0)
        replays.append(Simulator(job, cluster, models).run_once(np.random.default_rng(seed)).wall_time_s)
    recovery = [x for o in observed for x in o.recovery_s]
    delay = float(np.mean(recovery)) if recovery else 0.0
    source: Callable[[], Any] | None = None
    if revocations.mode == "lifetime":
        from cmdare.measure.lifetime_models import ExponentialLifetime

        lifetimes: Any = ModelLifetimes(ExponentialLifetime(revocations.mean_s))
    else:
        lifetimes = ScriptedLifetimes()  # no lifetime ends a server: the periodic source revokes
        source = periodic_source(revocations.every_s, revocations.first_s, seed)
    models = PlanModels(TableSpeed(_pool_speed(observed)), lifetimes, FixedStartup(delay), prices, checkpoint_s=0.0)
    return replays, Simulator(job, cluster, models, revocations=source).summarize(runs, seed).to_dict()


def compare(workers: int = 3, steps: int = 2500, revocations: Revocations | None = None,
            startup_s: float = 3.0, seed: int = 7, runs: int = 2000, real_runs: int = 1,
            model: str = "resnet8") -> dict[str, Any]:
    """Run the real job ``real_runs`` times (seeds ``seed``, ``seed + 1``, ...), simulate it, and return
    the figures (see the module docstring); the real wall time compared is the runs' mean."""
    import ray

    revocations = revocations or Revocations()
    observed: list[Observed] = []
    t = time.perf_counter()
    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=6)
    try:
        for k in range(real_runs):
            with tempfile.TemporaryDirectory(prefix="cmdare-simreal-") as tmp:
                observed.append(analyze(real_run(steps, workers, revocations, startup_s, seed + k, Path(tmp),
                                                 model)))
    finally:
        if started:
            ray.shutdown()
    real_total_s = time.perf_counter() - t
    replays, sim = simulate(observed, workers, steps, revocations, runs, seed)
    walls = [o.wall_s for o in observed]
    lags = [x for o in observed for x in o.replacement_clock_lag_s]
    real = float(np.mean(walls))
    return {
        "real_wall_s": round(real, 2),
        "sim_mean_wall_s": round(sim["time_mean_s"], 2),
        "sim_p50": round(sim["time_p50_s"], 2),
        "sim_p95": round(sim["time_p95_s"], 2),
        "error_pct": round(100 * abs(sim["time_mean_s"] - real) / real, 2),
        "real_walls_s": [round(w, 2) for w in walls],
        "replay_walls_s": [round(r, 2) for r in replays],
        "replay_error_pct": round(max(100 * abs(r - w) / w for r, w in zip(replays, walls, strict=True)), 2),
        "real_revocations": [o.revocations for o in observed],
        "sim_revocations_mean": round(sim["revocations_mean"], 2),
        "speed_table_steps_per_s": {str(k): round(v, 2) for k, v in _pool_speed(observed).items()},
        "time_at_count_s": [{str(k): round(v, 1) for k, v in o.time_at_count_s.items()} for o in observed],
        "observed_recovery_s": [round(x, 2) for o in observed for x in o.recovery_s],
        "initial_offset_s": round(float(np.mean([x for o in observed for x in o.initial_offset_s])), 2),
        "replacement_clock_lag_s": round(float(np.mean(lags)), 2) if lags else None,
        "hand_correction": False,  # the simulator's lifetimes are not shifted by the offsets above
        "real_startup_s": [round(o.startup_s, 2) for o in observed],
        "initial_join_spread_s": [round(o.initial_join_spread_s, 2) for o in observed],
        "real_total_s": round(real_total_s, 2),
        "config": {"workers": workers, "ps": 1, "steps": steps, "model": model,
                   "revocations": revocations.__dict__, "startup_s": startup_s, "seed": seed, "runs": runs,
                   "real_runs": real_runs},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--mode", choices=("lifetime", "every"), default="lifetime")
    p.add_argument("--lifetime-mean-s", type=float, default=45.0)
    p.add_argument("--every-s", type=float, default=10.0)
    p.add_argument("--first-s", type=float, default=5.0)
    p.add_argument("--startup-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--real-runs", type=int, default=1)
    p.add_argument("--model", default="resnet8")
    a = p.parse_args()
    rev = Revocations(a.mode, a.lifetime_mean_s, a.every_s, a.first_s)
    print(json.dumps(compare(a.workers, a.steps, rev, a.startup_s, a.seed, a.runs, a.real_runs, a.model)))


if __name__ == "__main__":
    main()
