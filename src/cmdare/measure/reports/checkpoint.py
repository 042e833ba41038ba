"""``cmdare report checkpoint``: checkpoint duration (local save, remote upload) against size."""

from __future__ import annotations

from typing import Any

import numpy as np

from cmdare.measure.reports.base import Report, require_rows
from cmdare.measure.store import Store

MB = 1 << 20


def build(store: Store, run_id: str | None = None) -> Report:
    """Per model: size, local and remote duration; linear fits of duration on size."""
    import pandas as pd

    df = store.frame("checkpoints")
    if run_id is not None:
        df = df[df.run_id == run_id]
    require_rows(df, "checkpoints", store.url, "cmdare import cmdare DIR (or record a run with StoreRecorder)")
    df["size_mb"] = df.size_bytes / MB
    df["model_name"] = df.model_name.fillna(df.run_id).fillna("unknown")
    table = (
        df.groupby(["source", "model_name"], as_index=False)
        .agg(
            checkpoints=("id", "size"),
            size_mb=("size_mb", "mean"),
            num_tensors=("num_tensors", "max"),
            local_s=("local_duration_s", "mean"),
            local_std_s=("local_duration_s", "std"),
            remote_s=("remote_duration_s", "mean"),
            remote_std_s=("remote_duration_s", "std"),
        )
        .sort_values("size_mb")
    )
    fits, notes = [], []
    for col in ("local_duration_s", "remote_duration_s"):
        sub = df[df[col].notna()]
        if len(sub) >= 3 and sub.size_mb.nunique() > 1:
            slope, icpt = np.polyfit(sub.size_mb, sub[col], 1)
            pred = icpt + slope * sub.size_mb
            mape = float(np.mean(np.abs(pred - sub[col]) / sub[col].clip(lower=1e-9)))
            fits.append({"duration": col, "points": len(sub), "intercept_s": icpt, "s_per_mb": slope, "mape": mape})
            notes.append(f"{col[:-2]}: {icpt:.3f} s + {slope * 1000:.2f} ms/MB (linear fit MAPE {mape:.1%})")
    fit_df = pd.DataFrame(fits)

    def plot(fig: Any) -> None:
        ax = fig.subplots(1, 1)
        for col, label in (("local_duration_s", "local save"), ("remote_duration_s", "local + upload")):
            sub = df[df[col].notna()]
            if sub.empty:
                continue
            pts = ax.scatter(sub.size_mb, sub[col], s=12, alpha=0.6, label=label)
            f = fit_df[fit_df.duration == col] if not fit_df.empty else fit_df
            if len(f):
                x = np.linspace(0, sub.size_mb.max() * 1.05, 50)
                ax.plot(x, f.intercept_s.iloc[0] + f.s_per_mb.iloc[0] * x, "--", color=pts.get_facecolor()[0])
        ax.set(xlabel="checkpoint size (MB)", ylabel="duration (s)")
        ax.legend()

    return Report(
        "checkpoint",
        "Checkpoint duration vs size",
        {"by_model": table, "fits": fit_df},
        notes,
        plot,
        figsize=(8, 5),
    )
