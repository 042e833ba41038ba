"""``cmdare report startup``: server startup phases per source, GPU type, transient vs on-demand (and region).

Every row says where its servers come from (:data:`PUBLIC`, :data:`EMULATED`, :data:`MEASURED`), and rows
of different sources are never averaged together: an emulated server's provisioning, staging and booting
were drawn from the startup model fitted on the public data, so they are not a measurement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cmdare.measure.reports.base import Report, require_rows
from cmdare.measure.store import Store

PHASES = ("provisioning_s", "staging_s", "booting_s", "joining_s")
PUBLIC = "public GCE measurement (CM-DARE)"
EMULATED = "cmdare run (emulated)"
MEASURED = "cmdare run (measured)"
SOURCE_ORDER = (PUBLIC, MEASURED, EMULATED)
_SHORT = {PUBLIC: "public", MEASURED: "measured", EMULATED: "emulated"}


def server_source(source: Any, run_id: Any, emulated: Any) -> str:
    """The label of a server row: the public CM-DARE data, another import, or a cmdare run's server."""
    src = str(source or "")
    if src.startswith("cmdare:startup"):
        return PUBLIC
    if isinstance(run_id, str) and run_id:
        return EMULATED if bool(emulated) else MEASURED
    return f"imported ({src or 'unknown'})"


def phase_table(store: Store) -> Any:
    """GPU servers with phase durations (imported ones, and cmdare's own), each labelled with its ``source``.

    Parameter servers are left out: the public data has no CPU servers, so an emulated one's start-up is
    drawn from a GPU server's figures and says nothing of its own."""
    df = store.frame("servers")
    have = df[list(PHASES[:3])].notna().any(axis=1) if not df.empty else df.index == 0
    have &= (df.role != "ps") if "role" in df.columns else True
    df = df[have].copy()
    require_rows(df, "server startup phases", store.url, "cmdare import cmdare DIR (CM-DARE's processed_data)")
    df["source"] = [server_source(*r) for r in zip(df.source, df.run_id, df.emulated, strict=True)]
    df["market"] = np.where(df.transient.astype(bool), "transient", "on-demand")
    df["gpu_type"] = df.gpu_type.fillna("unknown").str.lower()
    df["region"] = df.region.fillna("unknown")
    return df


def _grouped(df: Any, keys: list[str]) -> Any:
    agg = {p: (p, "mean") for p in PHASES}
    out = df.groupby(keys, as_index=False).agg(servers=("server_id", "size"), **agg)
    out["total_s"] = out[list(PHASES)].fillna(0).sum(axis=1)
    rank = {s: i for i, s in enumerate(SOURCE_ORDER)}
    order = out.source.map(lambda s: rank.get(s, len(rank)))
    return out.assign(_o=order).sort_values(["_o", *keys[1:]]).drop(columns="_o").reset_index(drop=True)


def _source_notes(df: Any) -> list[str]:
    """Which rows are emulated or from cmdare's own real-cluster runs, and what their phases mean."""
    notes = []
    for label, what in (
        (EMULATED, "are emulated servers (local stand-ins for cloud VMs): their provisioning, staging and "
                   "booting were drawn from the startup model fitted on the public GCE data (or fixed by "
                   "--startup), not measured (nor is joining_s, what the local join took beyond those draws)"),
        (MEASURED, "are servers of runs on a real Ray cluster: joining_s is measured; provisioning, staging "
                   "and booting are the start-up delay cmdare waited (the startup model's draw unless "
                   "--startup gave seconds)"),
    ):
        sub = df[df.source == label]
        if len(sub):
            runs = sorted(sub.run_id.dropna().unique())
            shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
            notes.append(f"rows '{label}' ({len(sub)} servers of {shown}) {what}")
    return notes


def build(store: Store, run_id: str | None = None) -> Report:
    """The startup report from every server with recorded phases, one row group per source."""
    df = phase_table(store)
    by_market = _grouped(df, ["source", "gpu_type", "market"])
    by_region = _grouped(df, ["source", "gpu_type", "market", "region"])
    notes = []
    for (source, gpu), g in by_market.groupby(["source", "gpu_type"], sort=False):
        m = g.set_index("market")
        if {"transient", "on-demand"} <= set(m.index):
            diff = m.loc["transient", list(PHASES[:3])] - m.loc["on-demand", list(PHASES[:3])]
            main = diff.abs().idxmax()
            notes.append(
                f"{source}, {gpu}: transient startup {m.loc['transient', 'total_s']:.1f} s vs on-demand "
                f"{m.loc['on-demand', 'total_s']:.1f} s; largest difference in {main[:-2]} "
                f"({diff[main]:+.1f} s)"
            )
    notes += _source_notes(df)

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        labels = [f"{r.gpu_type}\n{r.market}\n{_SHORT.get(r.source, r.source)}" for r in by_market.itertuples()]
        emulated = (by_market.source == EMULATED).to_numpy()
        bottom = np.zeros(len(by_market))
        for k, p in enumerate(PHASES):
            vals = by_market[p].fillna(0).to_numpy(float)
            if not vals.any():
                continue
            # an emulated server's phases are sampled cloud seconds; its joining is the real process start,
            # measured here: never one undivided bar
            real = vals * emulated if p == "joining_s" else np.zeros_like(vals)
            if (vals - real).any():
                ax1.bar(labels, vals - real, bottom=bottom, label=p[:-2], color=f"C{k}")
            if real.any():
                ax1.bar(labels, real, bottom=bottom + vals - real, color=f"C{k}", hatch="//", edgecolor="white",
                        label="joining: this machine's process start (emulated servers)")
            bottom += vals
        ax1.set(ylabel="seconds", title="Start-up phases (mean per server)", ylim=(0, bottom.max() * 1.45))
        ax1.legend(fontsize=7, loc="upper left", ncol=2)
        groups = [
            (f"{g}\n{m}\n{_SHORT.get(s, s)}", part.staging_s.dropna().to_numpy(float))
            for (s, g, m), part in df.groupby(["source", "gpu_type", "market"])
        ]
        ax2.boxplot([v for _, v in groups], tick_labels=[k for k, _ in groups])
        ax2.set(ylabel="staging (s)", title="Staging time per server")

    return Report(
        "startup",
        "Server startup phases",
        {"by_market": by_market, "by_region": by_region},
        notes,
        plot,
        figsize=(13, 4.5),
    )
