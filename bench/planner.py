"""Planner speed: (1) 1,000 simulated runs of a 64-worker, 24-hour job; (2) a full plan over >= 500
configurations x 100 runs. Prints one JSON object as its last line.

Targets (issue 7): (1) under 10 s on one core; (2) under 60 s.
Baselines measured in the same run:
  (1) the same simulation asking the speed model (cmdare.predict) at every membership change instead
      of once per membership (run on 1/20 of the runs and extrapolated);
  (2) the same plan without dominance pruning (every transient configuration simulated).

Usage: .venv/bin/python bench/planner.py [--runs 1000] [--plan-runs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


from cmdare.plan.adapters import load_plan_models  # noqa: E402
from cmdare.plan.recommender import enumerate_clusters, evaluate  # noqa: E402
from cmdare.plan.simulator import Simulator  # noqa: E402
from cmdare.plan.spec import ClusterSpec, JobSpec, PlanModels, WorkerGroup  # noqa: E402


class _UncachedSimulator(Simulator):
    """Baseline: asks the speed model at every membership change (no per-membership cache)."""

    def rate(self, counts: tuple[int, ...], chief_gpu: int, ps: int | None = None) -> float:
        self._rates.clear()
        if hasattr(self.models.speed, "_cache"):
            self.models.speed._cache.clear()
        return super().rate(counts, chief_gpu, ps)


def bench_runs(models: PlanModels, runs: int) -> dict[str, float]:
    cluster = ClusterSpec((WorkerGroup("k80", 64, True, "us-east1"),), ps=8, region="us-east1")
    probe = Simulator(JobSpec("t2t_resnet32", 1000), cluster, models)
    steps = int(24 * 3600 / probe.base_time_s * 1000)  # a job that takes 24 h without revocations
    job = JobSpec("t2t_resnet32", steps)
    t0 = time.perf_counter()  # cold: the speed model is asked for every new membership
    summary = Simulator(job, cluster, models).summarize(runs, seed=0)
    fast_s = time.perf_counter() - t0
    base_runs = max(runs // 20, 10)
    t0 = time.perf_counter()
    _UncachedSimulator(job, cluster, models).summarize(base_runs, seed=0)
    base_s = (time.perf_counter() - t0) * runs / base_runs
    return {
        "sim_runs": runs,
        "sim_workers": 64,
        "sim_job_steps": steps,
        "sim_seconds": round(fast_s, 3),
        "sim_target_seconds": 10.0,
        "sim_mean_time_h": round(summary.time_mean_s / 3600, 3),
        "sim_revocations_mean": round(summary.revocations_mean, 2),
        "sim_baseline_uncached_speed_seconds_extrapolated": round(base_s, 3),
        "sim_speedup_vs_uncached_speed": round(base_s / fast_s, 2),
    }


def bench_plan(models: PlanModels, runs: int) -> dict[str, float]:
    job = JobSpec("t2t_resnet32", 64000)
    clusters = enumerate_clusters(["k80", "p100", "v100", "t4"], ["us-east1"], max_workers=8)
    t0 = time.perf_counter()
    _, pruned = evaluate(job, clusters, models, runs=runs, seed=0, prune=True)
    plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, full = evaluate(job, clusters, models, runs=runs, seed=0, prune=False)
    full_s = time.perf_counter() - t0
    return {
        "plan_configurations": len(clusters),
        "plan_runs_per_configuration": runs,
        "plan_seconds": round(plan_s, 3),
        "plan_target_seconds": 60.0,
        "plan_monte_carlo_configurations": pruned["simulated_monte_carlo"],
        "plan_pruned": pruned["pruned_dominated"],
        "plan_exact_on_demand": pruned["exact_on_demand"],
        "plan_no_pruning_seconds": round(full_s, 3),
        "plan_no_pruning_monte_carlo_configurations": full["simulated_monte_carlo"],
        "plan_speedup_from_pruning": round(full_s / plan_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--plan-runs", type=int, default=100)
    args = parser.parse_args()
    t0 = time.perf_counter()
    models = load_plan_models("t2t_resnet32", "bathtub")
    # Warm the speed model and lifetime tables (fitted/loaded once per process, not per plan).
    Simulator(JobSpec("t2t_resnet32", 1000), ClusterSpec((WorkerGroup("k80", 2, True, "us-east1"),)),
              models).summarize(2, 0)
    load_s = time.perf_counter() - t0
    out = {"bench": "planner", "model_load_seconds": round(load_s, 3)}
    out.update(bench_runs(models, args.runs))
    print(f"runs: {out['sim_seconds']} s for {args.runs} runs", flush=True)
    out.update(bench_plan(models, args.plan_runs))
    print(f"plan: {out['plan_seconds']} s ({out['plan_no_pruning_seconds']} s without pruning)", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
