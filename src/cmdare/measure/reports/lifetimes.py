"""``cmdare report lifetimes``: lifetime CDFs per server type and region, with fitted models.

Per server type (and per region): servers observed, mean lifetime, fraction revoked within 1 h and
before 24 h; per type with enough data, the exponential and bathtub fits and their Kolmogorov-Smirnov
distance to the empirical CDF; revocations by hour of day. The plot draws the empirical CDFs with the
fitted models over them. The ``markets`` table shows, per cloud and market of the server catalog
(GCE preemptible, GCE Spot, AWS Spot, on-demand), the lifetime model the planner and emulation use
(``--lifetime auto``), its mean lifetime and chance of a revocation by 24 h and 30 days, and the data
it was fitted on or the assumption it rests on (:func:`cmdare.measure.lifetime_markets.market_rows`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from cmdare.file_cache import cached_json, code_digest
from cmdare.measure import lifetime_models
from cmdare.measure.lifetime_models import (
    BathtubLifetime,
    EmpiricalLifetime,
    ExponentialLifetime,
    LifetimeModel,
    empirical_cdf,
    ks_distance,
    model_from_dict,
)
from cmdare.measure.reports.base import Report, require_rows
from cmdare.measure.store import Store

MIN_FIT = 30  # fit models only on types with at least this many servers
MIN_REGION_FIT = 100  # ... and per region (key "<type>-<region>") from this many
BEFORE_DEADLINE_S = 24 * 3600.0 - 300.0  # "revoked before 24 h": ended more than 5 min before the deadline
# Types whose end times are trustworthy revocations; "gpu"/"unlabeled" (the spreadsheet's previous
# experiments) may include servers deleted by the experimenters, so they get no default models.
DEFAULT_TYPES = ("k80", "p100", "v100", "cpu")
GPU_TYPES = ("k80", "p100", "v100")


def shown_type(stype: str) -> str:
    """A server type as a plot labels it (``gpu``/``unlabeled``: the spreadsheet's earlier experiments)."""
    return {"cpu": "CPU", "gpu": "GPU of unrecorded type", "unlabeled": "unrecorded type"}.get(stype, stype.upper())


def fit_models(lifetimes_s: np.ndarray, censored: np.ndarray | None) -> dict[str, LifetimeModel]:
    """Exponential, bathtub and empirical models fitted to one group (the bathtub's fit, half a second
    each, is kept on disk by the data it was fitted on)."""
    return {
        "exponential": ExponentialLifetime().fit(lifetimes_s, censored),
        "bathtub": _cached_bathtub(np.asarray(lifetimes_s, float), censored),
        "empirical": EmpiricalLifetime().fit(lifetimes_s, censored),
    }


def _cached_bathtub(lifetimes_s: np.ndarray, censored: np.ndarray | None) -> LifetimeModel:
    from cmdare.paths import models_dir, private_dir

    cens = np.zeros(lifetimes_s.size, bool) if censored is None else np.asarray(censored, bool)
    key = hashlib.sha256(lifetimes_s.tobytes() + cens.tobytes()).hexdigest()
    code = code_digest([Path(lifetime_models.__file__)])
    path = private_dir(models_dir() / "lifetime_fits") / f"bathtub-{code}.json"
    return cached_json(path, key, lambda: BathtubLifetime().fit(lifetimes_s, cens), lambda m: m.to_dict(),
                       model_from_dict)


def fit_default_models(df: Any) -> dict[str, dict[str, Any]]:
    """``{model: {key: model_dict}}`` for the shipped defaults: one key per type with data, one per
    type and region with enough data (``cpu-us-central1``), and ``default`` = the GPU types pooled."""
    out: dict[str, dict[str, Any]] = {"exponential": {}, "bathtub": {}, "empirical": {}}
    groups = {t: df[df.server_type == t] for t in DEFAULT_TYPES}
    groups["default"] = df[df.server_type.isin(GPU_TYPES)]
    for (stype, region), g in df[df.server_type.isin(DEFAULT_TYPES)].groupby(["server_type", "region"]):
        if len(g) >= MIN_REGION_FIT and region:
            groups[f"{stype}-{region}"] = g
    for key, g in groups.items():
        if len(g) < MIN_FIT:
            continue
        t, cens = g.lifetime_s.to_numpy(float), ~g.preempted.to_numpy(bool)
        for name, model in fit_models(t, cens).items():
            model.meta = {
                "n": len(g),
                "ks": round(ks_distance(model, t, cens), 4),
                "source": sorted(set(g.source)),
                "types": sorted(set(g.server_type)),
            }
            out[name][key] = model.to_dict()
    return out


def _spot_traces() -> tuple[list[dict[str, Any]], list[tuple[str, np.ndarray, np.ndarray, LifetimeModel]]]:
    """Per fit of :mod:`cmdare.measure.spot_fits` whose traces are at hand: a table row and its trace's lifetimes."""
    from cmdare.measure.spot_fits import all_fits
    from cmdare.measure.spot_traces import read_spot_trace

    rows, curves = [], []
    for fit, paths in all_fits():
        present = [p for p in paths if p.exists()]
        rows.append({"offering": fit.key, "source": fit.source, "fitted_on": fit.fitted_on, "model": fit.chosen,
                     **{k: round(float(v), 4) for k, v in fit.model.params().items()},
                     "servers": fit.servers, "preemptions": fit.preemptions,
                     "server_hours": round(fit.server_hours, 1), "shipped": fit.shipped})
        if present:
            lifetimes = [read_spot_trace(p).spans.lifetimes() for p in present]
            curves.append((fit.key, np.concatenate([t for t, _ in lifetimes]),
                           np.concatenate([c for _, c in lifetimes]), fit.model))
    return rows, curves


def _summary_row(g: Any, server_type: str, region: str) -> dict[str, Any]:
    t = g.lifetime_s.to_numpy(float)
    rev = g.preempted.to_numpy(bool)
    return {
        "server_type": server_type,
        "region": region,
        "servers": len(g),
        "mean_lifetime_h": float(t.mean() / 3600),
        "median_lifetime_h": float(np.median(t) / 3600),
        "revoked_within_1h": float(np.mean(rev & (t <= 3600))),
        "revoked_before_24h": float(np.mean(rev & (t < BEFORE_DEADLINE_S))),
        "censored": int((~rev).sum()),
    }


def build(store: Store, run_id: str | None = None) -> Report:
    """The lifetimes report from every lifetime observation in the store."""
    import pandas as pd

    df = store.frame("lifetime_observations")
    require_rows(
        df,
        "lifetime observations",
        store.url,
        "cmdare import lifetimes gce_gpu_lifetimes.csv gce_cpu_preemptions.json",
    )
    df["region"] = df.region.fillna("unknown")
    rows, fits, fitted = [], [], {}
    for stype, g in df.groupby("server_type", sort=True):
        rows.append(_summary_row(g, stype, "all"))
        for region, gr in g.groupby("region", sort=True):
            if g.region.nunique() > 1:
                rows.append(_summary_row(gr, stype, region))
        if len(g) >= MIN_FIT:
            t, cens = g.lifetime_s.to_numpy(float), ~g.preempted.to_numpy(bool)
            models = fit_models(t, cens)
            fitted[stype] = (t, cens, models)
            b = models["bathtub"]
            fits.append(
                {
                    "server_type": stype,
                    "servers": len(g),
                    "exponential_mean_h": models["exponential"].mean_s_ / 3600,
                    "exponential_ks": ks_distance(models["exponential"], t, cens),
                    "bathtub_A": b.A_,
                    "bathtub_tau1_h": b.tau1_s_ / 3600,
                    "bathtub_tau2_h": b.tau2_s_ / 3600,
                    "bathtub_b_h": b.b_s_ / 3600,
                    "bathtub_ks": ks_distance(b, t, cens),
                }
            )
    hours = df[df.preempted & df.hour_of_day.notna() & (df.lifetime_s < BEFORE_DEADLINE_S)]
    by_hour = (
        hours.groupby(["server_type", hours.hour_of_day.astype(int)])
        .size()
        .unstack(fill_value=0)
        .reindex(columns=range(24), fill_value=0)
    )
    by_hour.columns = [f"h{h:02d}" for h in by_hour.columns]
    by_hour = by_hour.reset_index()
    notes = [
        f"{r['server_type']}: bathtub KS {r['bathtub_ks']:.3f} vs exponential KS {r['exponential_ks']:.3f} "
        f"({r['servers']} servers)"
        for r in fits
    ]
    notes.append(
        "revoked_before_24h counts revocations more than 5 min before the 24 h deadline; "
        "hour of day is the (local) hour the server was revoked"
    )

    def plot(fig: Any) -> None:
        from matplotlib.lines import Line2D

        ax1, ax2, ax3, ax4 = fig.subplots(1, 4)
        colors = {}
        for stype, (t, cens, models) in fitted.items():
            x, f = empirical_cdf(t, cens)
            ks_b = ks_distance(models["bathtub"], t, cens)
            ks_e = ks_distance(models["exponential"], t, cens)
            label = f"{shown_type(stype)}: {len(t)} servers (KS bathtub {ks_b:.2f}, exponential {ks_e:.2f})"
            line = ax1.step(x / 3600, f, where="post", label=label)[0]
            colors[stype] = line.get_color()
            grid = np.linspace(0, max(x.max(), 24 * 3600) * 1.02, 400)
            ax1.plot(grid / 3600, models["bathtub"].cdf(grid), "--", color=line.get_color(), lw=1)
            ax1.plot(grid / 3600, models["exponential"].cdf(grid), ":", color=line.get_color(), lw=1)
        ax1.set(xlabel="lifetime (h)", ylabel="fraction revoked by then", title="Lifetime CDF per server type")
        kinds = ax1.legend(handles=[Line2D([], [], color="k", lw=1.5, label="measured"),
                                    Line2D([], [], color="k", lw=1, ls="--", label="bathtub fit"),
                                    Line2D([], [], color="k", lw=1, ls=":", label="exponential fit")],
                           fontsize=7, loc="lower right")
        ax1.add_artist(kinds)
        ax1.legend(fontsize=6.5, loc="center right", bbox_to_anchor=(1.0, 0.55))
        for stype in [s for s in ("k80", "cpu") if s in fitted] or list(fitted)[:1]:
            sub = df[df.server_type == stype]
            for region, g in sub.groupby("region"):
                if len(g) >= 10:
                    x, f = empirical_cdf(g.lifetime_s.to_numpy(float), ~g.preempted.to_numpy(bool))
                    ax2.step(x / 3600, f, where="post", label=f"{shown_type(stype)} {region}: {len(g)} servers")
        ax2.set(xlabel="lifetime (h)", ylabel="fraction revoked by then", title="Lifetime CDF per region (measured)")
        ax2.legend(fontsize=6.5, loc="upper left")
        width = 0.8 / max(len(by_hour), 1)
        for i, row in enumerate(by_hour.itertuples(index=False)):
            counts = np.array(row[1:], dtype=float)
            ax3.bar(np.arange(24) + i * width, counts, width=width, label=shown_type(row[0]),
                    color=colors.get(row[0]))
        ax3.set(xlabel="hour of day the server was revoked (local)", ylabel="servers revoked within 24 h",
                title="Revocations by hour of day")
        ax3.set_xticks(range(0, 24, 3))
        ax3.legend(fontsize=6.5, loc="upper left")
        for key, t, cens, model in spot_curves:
            x, f = empirical_cdf(t, cens)
            line = ax4.step(x / 3600, f, where="post", label=f"{key}: {len(t)} servers, {model.name} fit")[0]
            grid = np.linspace(0, x.max() * 1.02, 300)
            ax4.plot(grid / 3600, model.cdf(grid), "--", color=line.get_color(), lw=1)
        ax4.set(xlabel="lifetime (h)", ylabel="fraction preempted by then (Kaplan-Meier)",
                title="Spot lifetimes from traces (dashed: fit)")
        ax4.legend(fontsize=6.5, loc="lower right")

    from cmdare.cloud.catalog import default_catalog
    from cmdare.measure.lifetime_markets import market_rows

    markets = pd.DataFrame(market_rows(default_catalog()))
    spot_rows, spot_curves = _spot_traces()
    notes.append("spot_traces: lifetimes of spot servers in public preemption traces (censored at each trace's end) "
                 "and the model chosen by held-out likelihood; the spot markets they cover use it")
    notes.append("markets: the lifetime model per cloud and market (--lifetime auto); 'basis' names the measured "
                 "data it was fitted on, or the assumption (interruption rate, source, date) where none exists")
    return Report(
        "lifetimes",
        "Server lifetimes: GCE preemptible (CM-DARE data) and spot (public traces)",
        {"summary": pd.DataFrame(rows), "markets": markets, "fits": pd.DataFrame(fits), "by_hour": by_hour,
         "spot_traces": pd.DataFrame(spot_rows)},
        notes,
        plot,
        figsize=(21, 5),
    )
