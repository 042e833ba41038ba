"""What ``cmdare plan`` prints: a recommendation as a table with its reasons, or as JSON."""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["print_rec", "rec_json"]


def _retired_in(cluster, retired: Collection[str]) -> list[str]:
    """The GPU types of ``cluster`` among ``retired``."""
    return [g for g in cluster.gpu_counts if g in retired]


def rec_json(rec, lifetimes, retired: Collection[str] = ()) -> dict:
    """A recommendation as JSON: the choice, its reasons, the Pareto front and the search's statistics; each
    configuration lists its ``retired`` GPU types (``retired_gpus``)."""
    from cmdare.plan.markets import lifetime_labels

    def one(o):
        return {"config": o.cluster.label(), "lifetime_models": lifetime_labels(o.cluster, lifetimes),
                "retired_gpus": _retired_in(o.cluster, retired), **o.summary.to_dict()}

    return {
        "message": rec.message,
        "constraint_met": rec.constraint_met,
        "choice": one(rec.choice) if rec.choice else None,
        "reasons": list(rec.reasons),
        "front": [one(o) for o in rec.front],
        "stats": rec.stats,
    }


def print_rec(rec, source: str, plot: str | None, lifetimes, retired: Collection[str] = (),
              notes: Sequence[str] = ()) -> None:
    """A recommendation on the console: the Pareto front's table (configurations of ``retired`` GPU types
    flagged), the search's statistics, the choice and why, then ``notes``."""
    from rich.table import Table

    from cmdare.console import console as make_console
    from cmdare.plan.markets import lifetime_labels
    from cmdare.plan.recommender import format_duration

    console = make_console()
    table = Table(title="Time/cost Pareto front (expected, P95) with predicted final accuracy (mean, P5)")
    cols = ["configuration", "time", "time P95", "cost", "cost P95", "revocations"]
    with_acc = any("accuracy_mean" in o.summary.extra for o in rec.front)
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
    if plot:
        console.print(f"Pareto plot: {plot}", highlight=False)
    for note in notes:
        console.print(f"note: {note}", highlight=False)
