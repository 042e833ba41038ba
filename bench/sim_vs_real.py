"""The planner's simulator against a real local cmdare run under injected revocations (issues 7, 28).

One real run: ``W`` emulated transient workers + 1 PS on the local Ray node, revocations injected by an
exponential lifetime model (mean ``--lifetime-mean-s``, saved as a model file: ``lifetime=FILE``) or every
``--every-s`` (``every=S,first=F``), replacement ``same`` after a fixed emulated start-up (``startup=S``).
The run is emulated: its cloud time advances with its training, ``--step-s`` emulated seconds per worker step
(``step=S``), so its revocations fall at the same steps on any machine. What is compared is the job's time
in that cloud time (the trainer's emulated clock when the target step is reached), which is what the
planner predicts for a real cloud; the real run's wall time depends on this machine, not on the plan.

From the real run's membership timeline (the controller's record, in emulated seconds) we take:

* its emulated time to the target step, and its revocations;
* the lifetime each server lived, counted as both drivers count it (from its server's ready time);

then the same job is simulated through :mod:`cmdare.plan` with the same speeds (``1 / step_s`` steps per
second per worker) and start-up:

* ``replay``: the real run's own lifetimes (:class:`~cmdare.plan.replay.ScriptedLifetimes`), one run: how
  exactly the two drivers agree when they see the same revocations;
* ``sim``: ``--runs`` seeded runs (mean, P50, P95), lifetimes drawn from the same model (:class:`ModelLifetimes`)
  or the control kernel's own :class:`~cmdare.control.PeriodicRevocations`: how well the plan predicts one
  run it does not know the draws of.

``error_pct`` = |sim mean - real| / real, ``replay_error_pct`` the same for the replay. Usage::

    .venv/bin/python bench/sim_vs_real.py [--workers 3] [--steps 3000] [--mode lifetime|every]
        [--lifetime-mean-s 45] [--every-s 10] [--first-s 5] [--startup-s 3] [--step-s 0.05] [--seed 7]
        [--runs 2000] [--real-runs 1]

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

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

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
    """What one real run reported: its membership timeline (emulated seconds) and its emulated end."""

    steps: int
    workers: int
    timeline: list[Any] = field(default_factory=list)  # MembershipEvent: kind, time, worker_id, slot
    end_s: float = 0.0
    wall_s: float = 0.0
    summary: Any = None


def real_run(steps: int, workers: int, revocations: Revocations, startup_s: float, step_s: float, seed: int,
             workdir: Path, model: str = "resnet8") -> RealRun:
    """One real local cmdare run with injected revocations; Ray is started here (if not running)."""
    import ray

    from cmdare.measure.lifetime_models import ExponentialLifetime
    from cmdare.train import Trainer, TrainSpec

    if revocations.mode == "lifetime":
        model_path = workdir / "lifetime.json"
        model_path.write_text(json.dumps(ExponentialLifetime(revocations.mean_s).to_dict()))
        text = f"lifetime={model_path},speedup=1,seed={seed},step={step_s}"
    else:
        text = f"every={revocations.every_s},first={revocations.first_s},seed={seed},step={step_s}"
    spec = TrainSpec(model=model, dataset="digits", workers=workers, ps=1, steps=steps, batch_size=32,
                     checkpoint_every=0, eval_every=0, seed=seed, transient=True, revocations=text, replace="same",
                     startup=str(startup_s))
    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=6)
    out = RealRun(steps, workers)
    try:
        t0 = time.perf_counter()
        trainer = Trainer(spec, checkpoint_dir=workdir / "ckpt")
        out.summary = trainer.run()
        out.wall_s = time.perf_counter() - t0
        out.timeline = list(trainer.kernel.timeline)
        out.end_s = trainer.controller.now
    finally:
        if started:
            ray.shutdown()
    return out


@dataclass
class Observed:
    """Figures of a real run, in emulated seconds since its first step."""

    emulated_s: float
    revocations: int
    script: list[float]  # the lifetimes its servers lived, as the simulator draws them (slot-major, then in order)
    wall_s: float


def analyze(run: RealRun) -> Observed:
    """The emulated time, the revocations and the lifetime script of a real run, from its timeline."""
    from cmdare.plan.simulator import _LIFETIMES_PER_SLOT as per

    joined: dict[int, tuple[int, float]] = {}  # worker -> (slot, ready time)
    lives: dict[int, list[tuple[float, float]]] = {s: [] for s in range(run.workers)}  # slot -> (start, life)
    revocations = 0
    for e in run.timeline:
        if e.kind == "join":
            joined[e.worker_id] = (e.slot, e.time)
        elif e.kind == "loss":
            revocations += 1
            slot, start = joined.pop(e.worker_id)
            lives[slot].append((start, e.time - start))
    for _w, (slot, start) in joined.items():  # alive at the end: never revoked
        lives[slot].append((start, np.inf))
    script: list[float] = []
    extra: list[tuple[float, float]] = []
    for s in range(run.workers):  # the simulator draws `per` lifetimes per slot up front, slot-major ...
        ordered = sorted(lives[s])
        script += [life for _, life in ordered[:per]] + [np.inf] * max(0, per - len(ordered))
        extra += ordered[per:]
    script += [life for _, life in sorted(extra)]  # ... and more in the order replacements join
    return Observed(run.end_s, revocations, script, run.wall_s)


class TableSpeed:
    """Cluster speed by live-worker count. A count not in the table: below the smallest, that speed scaled by
    the worker ratio; above the largest, the largest's speed."""

    def __init__(self, table: dict[int, float]):
        if not table:
            raise ValueError("empty speed table")
        self.table = dict(table)

    def cluster_steps_per_s(self, gpus: dict[str, int], ps: int) -> float:
        """The cluster speed for the live count."""
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
        """Mean share of one worker in the largest membership."""
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


def simulate(observed: list[Observed], workers: int, steps: int, revocations: Revocations, startup_s: float,
             step_s: float, runs: int, seed: int) -> tuple[list[float], dict[str, float]]:
    """(replay time per real run, Monte Carlo summary) with the emulated speeds and start-up."""
    from cmdare.plan import ClusterSpec, JobSpec, PlanModels, WorkerGroup
    from cmdare.plan.replay import FixedStartup, FlatPrices, MeasuredSpeed, ScriptedLifetimes
    from cmdare.plan.simulator import Simulator

    job = JobSpec("local", steps, checkpoint_every_steps=10**9)
    cluster = ClusterSpec((WorkerGroup(GPU, workers, transient=True),), ps=1, replacement="same")
    prices = FlatPrices({GPU: 0.0, "cpu": 0.0})
    speed = MeasuredSpeed({GPU: 1.0 / step_s})  # the emulated cluster's: the sum of its workers' speeds
    replays = []
    for o in observed:
        models = PlanModels(speed, ScriptedLifetimes({GPU: o.script}), FixedStartup(startup_s), prices,
                            checkpoint_s=0.0)
        replays.append(Simulator(job, cluster, models).run_once(np.random.default_rng(seed)).wall_time_s)
    source: Callable[[], Any] | None = None
    if revocations.mode == "lifetime":
        from cmdare.measure.lifetime_models import ExponentialLifetime

        lifetimes: Any = ModelLifetimes(ExponentialLifetime(revocations.mean_s))
    else:
        lifetimes = ScriptedLifetimes()  # no lifetime ends a server: the periodic source revokes
        source = periodic_source(revocations.every_s, revocations.first_s, seed)
    models = PlanModels(speed, lifetimes, FixedStartup(startup_s), prices, checkpoint_s=0.0)
    return replays, Simulator(job, cluster, models, revocations=source).summarize(runs, seed).to_dict()


def compare(workers: int = 3, steps: int = 3000, revocations: Revocations | None = None, startup_s: float = 3.0,
            step_s: float = 0.05, seed: int = 7, runs: int = 2000, real_runs: int = 1,
            model: str = "resnet8") -> dict[str, Any]:
    """Run the real job ``real_runs`` times (seeds ``seed``, ``seed + 1``, ...), simulate it, and return
    the figures (see the module docstring); the real time compared is the runs' mean."""
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
                observed.append(analyze(real_run(steps, workers, revocations, startup_s, step_s, seed + k,
                                                 Path(tmp), model)))
    finally:
        if started:
            ray.shutdown()
    real_total_s = time.perf_counter() - t
    replays, sim = simulate(observed, workers, steps, revocations, startup_s, step_s, runs, seed)
    times = [o.emulated_s for o in observed]
    real = float(np.mean(times))
    return {
        "real_emulated_s": round(real, 3),
        "sim_mean_s": round(sim["time_mean_s"], 3),
        "sim_p50": round(sim["time_p50_s"], 3),
        "sim_p95": round(sim["time_p95_s"], 3),
        "error_pct": round(100 * abs(sim["time_mean_s"] - real) / real, 2),
        "real_emulated_times_s": [round(x, 3) for x in times],
        "replay_times_s": [round(r, 3) for r in replays],
        "replay_error_pct": round(max(100 * abs(r - x) / x for r, x in zip(replays, times, strict=True)), 3),
        "real_revocations": [o.revocations for o in observed],
        "sim_revocations_mean": round(sim["revocations_mean"], 2),
        "real_wall_s": [round(o.wall_s, 1) for o in observed],
        "hand_correction": False,
        "real_total_s": round(real_total_s, 2),
        "config": {"workers": workers, "ps": 1, "steps": steps, "model": model, "step_s": step_s,
                   "revocations": revocations.__dict__, "startup_s": startup_s, "seed": seed, "runs": runs,
                   "real_runs": real_runs},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--mode", choices=("lifetime", "every"), default="lifetime")
    p.add_argument("--lifetime-mean-s", type=float, default=45.0)
    p.add_argument("--every-s", type=float, default=10.0)
    p.add_argument("--first-s", type=float, default=5.0)
    p.add_argument("--startup-s", type=float, default=3.0)
    p.add_argument("--step-s", type=float, default=0.05, help="emulated seconds per worker step")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--real-runs", type=int, default=1)
    p.add_argument("--model", default="resnet8")
    a = p.parse_args()
    rev = Revocations(a.mode, a.lifetime_mean_s, a.every_s, a.first_s)
    print(json.dumps(compare(a.workers, a.steps, rev, a.startup_s, a.step_s, a.seed, a.runs, a.real_runs, a.model)))


if __name__ == "__main__":
    main()
