"""Simulating one configuration: what ``cmdare plan simulate`` and ``cmdare train --simulate`` share.

:func:`revocation_source` reads ``--revocations`` as ``cmdare train`` reads it; :func:`simulate_configuration`
runs the Monte Carlo and returns the result as one JSON-able dict; :func:`print_simulation` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cmdare.errors import UserInputError
from cmdare.plan.spec import ClusterSpec, JobSpec, PlanModels

__all__ = ["print_simulation", "revocation_source", "simulate_configuration"]


def revocation_source(revocations: str | None, lifetime: str, seed: int, *, emulated: bool = False):
    """``--revocations`` read as ``cmdare train`` reads it: (lifetime model name, a factory of the revocation
    source for scheduled ones or None, the parsed plan: ``hit=`` and ``notice=`` apply too). ``lifetime=``
    picks the model (``auto``: each offering's market); ``every=`` and ``trace=`` replace lifetime draws.
    ``speedup`` and ``step`` emulate time in a local run: only an ``emulated`` simulation (of such a run)
    takes them."""
    from itertools import count

    import numpy as np

    from cmdare.control import NoRevocations, PeriodicRevocations, RevocationPlan, TraceRevocations

    plan = RevocationPlan.parse(revocations, seed=seed)
    if not emulated and (plan.speedup != 1.0 or plan.step_s is not None):
        raise UserInputError("--revocations: speedup and step emulate time in a local run; the planner simulates "
                             "real time (leave them out)")
    if revocations is None or plan.lifetime is not None:
        return plan.lifetime or lifetime, None, plan
    if plan.every_s is not None:
        seeds = count()  # one stream per simulated run, in run order
        every, first = plan.every_s, plan.first_s

        def periodic() -> PeriodicRevocations:
            return PeriodicRevocations(every, first, np.random.default_rng([plan.seed, next(seeds)]))

        return lifetime, periodic, plan
    if plan.trace:
        return lifetime, lambda: TraceRevocations(plan.trace, plan.speedup), plan
    return lifetime, NoRevocations, plan


def simulate_configuration(job: JobSpec, cluster: ClusterSpec, models: PlanModels,
                           sources: Callable[[], tuple[Any, Any]], runs: int, seed: int) -> tuple[dict[str, Any], Any]:
    """``runs`` seeded runs of ``cluster`` training ``job``: the result's figures (time, cost, revocations,
    replacements, evacuations, steps lost, accuracy, revocation timing) and the summary. ``sources()`` gives
    (a factory of the revocation source or None, the parsed ``--revocations``), fresh streams at each call."""
    from cmdare.plan.markets import lifetime_labels, revocation_stats, traced_runs
    from cmdare.plan.simulator import Simulator

    source, plan = sources()
    summary = Simulator(job, cluster, models, revocations=source, plan=plan).summarize(runs, seed)
    fresh, plan = sources()  # the same streams again, for the timelines
    stats = revocation_stats(traced_runs(Simulator(job, cluster, models, revocations=fresh, plan=plan), runs, seed))
    out = {
        "config": cluster.label(),
        "workers": cluster.gpu_counts,
        "ps": cluster.ps,
        "ps_transient": cluster.ps_transient,
        "region": cluster.region,
        "replacement": cluster.replacement,
        "replacement_timeout_s": cluster.replacement_timeout_s,
        "lifetime_models": lifetime_labels(cluster, models.lifetimes),
        "lr_policy": job.lr_policy,
        "runs": runs,
        "seed": seed,
        "time_s": {"mean": summary.time_mean_s, "p50": summary.time_p50_s, "p95": summary.time_p95_s},
        "cost_usd": {"mean": summary.cost_mean_usd, "p50": summary.cost_p50_usd, "p95": summary.cost_p95_usd},
        "revocations_mean": summary.revocations_mean,
        "replacements_mean": summary.replacements_mean,
        "evacuations_mean": summary.extra.get("evacuations_mean", 0.0),
        "parks_mean": summary.extra.get("parks_mean", 0.0),
        **stats,
        "steps_lost_mean": summary.steps_lost_mean,
        "finished_fraction": summary.finished_fraction,
        "accuracy": {"mean": summary.extra.get("accuracy_mean"), "p5": summary.extra.get("accuracy_p5")},
        "deterministic_time_s": summary.extra["deterministic_time_s"],
    }
    return out, summary


def print_simulation(out: dict[str, Any], title: str, *, cents: bool = False) -> None:
    """The result of :func:`simulate_configuration` as a table and its lines (``out["models"]`` names the
    models, ``out["notes"]`` are printed as notes); ``cents``: costs to 4 decimals (a small local run)."""
    from rich.table import Table

    from cmdare.console import console as make_console
    from cmdare.plan.recommender import format_duration

    table = Table(title=title)
    for col in ("", "mean", "P50", "P95"):
        table.add_column(col, justify="right")
    t, c = out["time_s"], out["cost_usd"]
    table.add_row("time", *(format_duration(t[k]) for k in ("mean", "p50", "p95")))
    table.add_row("cost", *(f"${c[k]:.4f}" if cents else f"${c[k]:.2f}" for k in ("mean", "p50", "p95")))
    a = out["accuracy"]
    if a["mean"] is not None:
        table.add_row("accuracy", f"{a['mean']:.2%}", "", f"P5 {a['p5']:.2%}")
    console = make_console()
    console.print(table)
    if out["ps_transient"]:
        console.print(f"parameter servers: {out['evacuations_mean']:.2f} shards evacuated ({out['parks_mean']:.2f} "
                      f"parked until their replacement was up), {out['steps_lost_mean']:.0f} steps lost",
                      highlight=False)
    console.print(
        f"revocations {out['revocations_mean']:.2f}, replacements {out['replacements_mean']:.2f}, "
        f"steps lost {out['steps_lost_mean']:.0f}; revocation-free time "
        f"{format_duration(out['deterministic_time_s'])}. Models: {out['models']}",
        highlight=False,
    )
    for note in out.get("notes", []):
        console.print(f"note: {note}", highlight=False)
