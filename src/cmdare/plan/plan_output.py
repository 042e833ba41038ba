"""What ``cmdare plan`` prints: a recommendation as a table with its reasons, or as JSON."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from cmdare.option_values import DEFAULT_BATCH_SIZE

__all__ = ["cluster_config_command", "print_rec", "rec_json", "train_command"]


def _retired_in(cluster, retired: Collection[str]) -> list[str]:
    """The GPU types of ``cluster`` among ``retired``."""
    return [g for g in cluster.gpu_counts if g in retired]


def train_command(cluster, job, cloud: str) -> str | None:
    """The ``cmdare train`` command line that trains ``job`` on ``cluster`` as the plan simulated it (every
    option the simulation rests on: model, steps, batch size, workers, shards, pricing, cloud, region, checkpoint
    interval, replacement and LR policies, the topology: an all-reduce group's steps are its group steps); None
    where ``train`` cannot: single-server training (``--ps 0``), or workers of both pricings."""
    from cmdare.plan.recommender import job_for

    pricing = {g.transient for g in cluster.workers}
    allreduce = cluster.topology == "allreduce"
    if (cluster.ps < 1 and not allreduce) or len(pricing) != 1:
        return None
    job = job_for(job, cluster)
    workers = ",".join(f"{g.gpu}:{g.count}" for g in cluster.workers)
    parts = ["cmdare train", f"--model {job.workload}", f"--steps {job.total_steps}"]
    parts += [f"--batch-size {job.batch_size}"] if job.batch_size not in (None, DEFAULT_BATCH_SIZE) else []
    parts += [f"--precision {job.precision}"] if getattr(job, "precision", "fp32") != "fp32" else []
    parts += [f"--workers {workers}", "--topology allreduce" if allreduce else f"--ps {cluster.ps}",
              "--transient" if pricing.pop() else "--on-demand"]
    parts += ["--ps-transient"] if cluster.ps_transient else []
    parts += [f"--cloud {cloud}", f"--region {cluster.region}", f"--checkpoint-every {job.checkpoint_every_steps}"]
    parts += [f"--replacement {cluster.replacement}"] if cluster.replacement != "same" else []
    parts += [f"--lr-policy {job.lr_policy}"] if job.lr_policy != "unchanged" else []
    from cmdare.workloads.import_path import is_import_path

    parts += ["--dataset YOUR.DATA:FACTORY"] if is_import_path(job.workload) else []
    return " ".join(parts)


def cluster_config_command(cluster, cloud: str) -> str:
    """The ``cmdare cluster-config`` command line of the Ray cluster ``cluster`` describes."""
    workers = ",".join(f"{g.gpu}:{g.count}" for g in cluster.workers)
    pricing = "--transient" if all(g.transient for g in cluster.workers) else "--on-demand"
    return (f"cmdare cluster-config --cloud {cloud} --region {cluster.region} --workers {workers} --ps {cluster.ps} "
            f"{pricing} -o cluster.yaml")


def rec_json(rec, lifetimes, retired: Collection[str] = (), job=None, cloud: str = "gcp") -> dict:
    """A recommendation as JSON: the choice, its reasons, the Pareto front and the search's statistics; each
    configuration lists its ``retired`` GPU types (``retired_gpus``)."""
    from cmdare.plan.markets import lifetime_labels

    def one(o):
        command = train_command(o.cluster, job, cloud) if job is not None else None
        return {"config": o.cluster.label(), "lifetime_models": lifetime_labels(o.cluster, lifetimes),
                "retired_gpus": _retired_in(o.cluster, retired), "train_command": command, **o.summary.to_dict()}

    return {
        "message": rec.message,
        "constraint_met": rec.constraint_met,
        "choice": one(rec.choice) if rec.choice else None,
        "reasons": list(rec.reasons),
        "front": [one(o) for o in rec.front],
        "stats": rec.stats,
    }


def print_rec(rec, source: str, plot: str | None, lifetimes, retired: Collection[str] = (),
              notes: Sequence[str] = (), job=None, cloud: str = "gcp") -> None:
    """A recommendation on the console: the Pareto front's table (configurations of ``retired`` GPU types
    flagged), the search's statistics, the choice, why, and (with ``job``) the command lines that train it, then
    ``notes``."""
    from rich.table import Table

    from cmdare.console import console as make_console
    from cmdare.plan.markets import lifetime_labels
    from cmdare.plan.recommender import format_duration

    console = make_console()
    table = Table(title="Time/cost Pareto front (expected, P95) with predicted final accuracy (mean, P5)")
    cols = ["configuration", "time", "time P95", "cost", "cost P95", "revocations"]
    with_acc = any("accuracy_mean" in o.summary.extra for o in rec.options)  # the workload has an accuracy model
    cols += ["accuracy", "accuracy P5"] if with_acc else []
    cols.append("lifetime model")
    for col in cols:
        table.add_column(col, justify="left" if col in ("configuration", "lifetime model") else "right")
    for o in rec.front:
        s = o.summary
        mark = "* " if o is rec.choice else ""
        old = _retired_in(o.cluster, retired)
        flag = f" (retired: {', '.join(g.upper() for g in old)})" if old else ""
        acc = [f"{s.extra['accuracy_mean']:.1%}", f"{s.extra['accuracy_p5']:.1%}"] if with_acc else []
        table.add_row(
            mark + o.cluster.label() + flag, format_duration(s.time_mean_s), format_duration(s.time_p95_s),
            f"${s.cost_mean_usd:.2f}", f"${s.cost_p95_usd:.2f}", f"{s.revocations_mean:.2f}", *acc,
            "; ".join(sorted(set(lifetime_labels(o.cluster, lifetimes).values()))) or "-",
        )
    console.print(table)
    st = rec.stats
    console.print(
        f"{st['configurations']:.0f} configurations: {st['exact_on_demand']:.0f} on-demand (exact), "
        f"{st['simulated_monte_carlo']:.0f} simulated x {st['runs_per_configuration']:.0f} runs, "
        f"{st['pruned_dominated']:.0f} pruned as dominated; {st['seconds']:.1f} s. Models: {source}",
        highlight=False,
    )
    style = "bold green" if rec.constraint_met else "bold yellow"
    console.print(f"[{style}]{rec.message}[/]", highlight=False)
    for reason in rec.reasons:
        console.print(f"  - {reason}", highlight=False)
    command = train_command(rec.choice.cluster, job, cloud) if job is not None and rec.choice else None
    if command is not None:
        console.print(f"train it on the Ray cluster `{cluster_config_command(rec.choice.cluster, cloud)}` describes "
                      f"(`ray up cluster.yaml`, then on its head):\n  {command} --address auto\n"
                      "(as printed without --address it trains here, emulated; with --simulate it is simulated)",
                      highlight=False)
    if plot:
        console.print(f"Pareto plot: {plot}", highlight=False)
    for note in notes:
        console.print(f"note: {note}", highlight=False)
