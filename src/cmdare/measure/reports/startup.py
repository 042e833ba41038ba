"""``cmdare report startup``: server startup phases per GPU type, transient vs on-demand (and region)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cmdare.measure.reports.base import Report, require_rows
from cmdare.measure.store import Store

PHASES = ("provisioning_s", "staging_s", "booting_s", "joining_s")


def phase_table(store: Store) -> Any:
    """Servers with phase durations (imported ones, and cmdare's own from their timestamps)."""
    df = store.frame("servers")
    have = df[list(PHASES[:3])].notna().any(axis=1) if not df.empty else df.index == 0
    df = df[have].copy()
    require_rows(df, "server startup phases", store.url, "cmdare import cmdare DIR (CM-DARE's processed_data)")
    df["market"] = np.where(df.transient.astype(bool), "transient", "on-demand")
    df["gpu_type"] = df.gpu_type.fillna("unknown")
    df["region"] = df.region.fillna("unknown")
    return df


def build(store: Store, run_id: str | None = None) -> Report:
    """The startup report from every server with recorded phases."""
    df = phase_table(store)
    agg = {p: (p, "mean") for p in PHASES}
    by_market = df.groupby(["gpu_type", "market"], as_index=False).agg(servers=("server_id", "size"), **agg)
    by_market["total_s"] = by_market[list(PHASES)].fillna(0).sum(axis=1)
    by_region = df.groupby(["gpu_type", "market", "region"], as_index=False).agg(servers=("server_id", "size"), **agg)
    by_region["total_s"] = by_region[list(PHASES)].fillna(0).sum(axis=1)
    notes = []
    for gpu, g in by_market.groupby("gpu_type"):
        m = g.set_index("market")
        if {"transient", "on-demand"} <= set(m.index):
            diff = m.loc["transient", list(PHASES[:3])] - m.loc["on-demand", list(PHASES[:3])]
            main = diff.abs().idxmax()
            notes.append(
                f"{gpu}: transient startup {m.loc['transient', 'total_s']:.1f} s vs on-demand "
                f"{m.loc['on-demand', 'total_s']:.1f} s; largest difference in {main[:-2]} "
                f"({diff[main]:+.1f} s)"
            )

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        labels = [f"{r.gpu_type}\n{r.market}" for r in by_market.itertuples()]
        bottom = np.zeros(len(by_market))
        for p in PHASES:
            vals = by_market[p].fillna(0).to_numpy(float)
            if vals.any():
                ax1.bar(labels, vals, bottom=bottom, label=p[:-2])
                bottom += vals
        ax1.set(ylabel="seconds", title="startup phases (mean)")
        ax1.legend(fontsize=8)
        groups = [
            (f"{g}\n{m}", s.staging_s.dropna().to_numpy(float)) for (g, m), s in df.groupby(["gpu_type", "market"])
        ]
        ax2.boxplot([v for _, v in groups], tick_labels=[k for k, _ in groups])
        ax2.set(ylabel="staging (s)", title="staging time per server")

    return Report(
        "startup",
        "Server startup phases",
        {"by_market": by_market, "by_region": by_region},
        notes,
        plot,
        figsize=(13, 4.5),
    )
