"""Pareto plot of a plan (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from cmdare.output_files import save_figure
from cmdare.plan.recommender import Recommendation

__all__ = ["plot_pareto"]


def plot_pareto(
    rec: Recommendation, path: str | Path, deadline_s: float | None = None, budget_usd: float | None = None,
    force: bool = False,
) -> Path:
    """Write a time/cost scatter of every simulated option with the Pareto front and the choice, as
    :func:`cmdare.output_files.open_output` writes a file: never over an existing one unless ``force``.

    Raises:
        UserInputError: the file cannot be written (a missing folder, an existing file without ``force``, ...).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    for transient, color, name in ((True, "tab:blue", "transient"), (False, "tab:orange", "on-demand")):
        pts = [o.point for o in rec.options if any(g.transient for g in o.cluster.workers) == transient]
        if pts:
            xs, ys = [p[0] / 3600 for p in pts], [p[1] for p in pts]
            ax.scatter(xs, ys, s=8, alpha=0.35, color=color, label=name)
    front = sorted(o.point for o in rec.front)
    ax.plot([p[0] / 3600 for p in front], [p[1] for p in front], "k.-", lw=1.2, label="Pareto front")
    if rec.choice is not None:
        t, c = rec.choice.point
        ax.scatter([t / 3600], [c], marker="*", s=250, color="tab:red", zorder=5,
                   label=f"choice: {rec.choice.cluster.label()}")
    if deadline_s is not None:
        ax.axvline(deadline_s / 3600, color="tab:red", ls="--", lw=1, label="deadline")
    if budget_usd is not None:
        ax.axhline(budget_usd, color="tab:green", ls="--", lw=1, label="budget")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    def hours(h: float, _pos: int) -> str:  # plain durations, never 2x10^-1
        return f"{h * 60:.0f} min" if h < 1 else f"{h:g} h"

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(hours))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("expected training time (log scale)")
    ax.set_ylabel("expected cost (USD)")
    ax.set_title("Expected time and cost of each configuration simulated")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    try:
        return save_figure(fig, path, "--plot", force)
    finally:
        plt.close(fig)
