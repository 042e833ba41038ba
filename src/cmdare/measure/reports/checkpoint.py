"""``cmdare report checkpoint``: checkpoint duration (local save, remote upload) against size.

Durations are fitted linearly on size per source (the public CM-DARE timings, cmdare's own runs), and
only where a source has checkpoints of at least two distinct sizes: a run's checkpoints are all one
size (a few bytes apart, for the step in their metadata), and a line through one size is noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cmdare.measure.reports.base import Report, require_rows
from cmdare.measure.store import Store

MB = 1 << 20
SAME_SIZE_RTOL = 0.01  # sizes within 1% of each other count as one size
MIN_FIT_POINTS = 3
DURATIONS = (("local_duration_s", "local save"), ("remote_duration_s", "local + upload"))
FIT_COLUMNS = ["source", "duration", "points", "sizes", "intercept_s", "s_per_mb", "mape", "note"]


def shown_source(source: str) -> str:
    """A store source as a plot labels it (``cmdare:checkpoint``: the public CM-DARE data's checkpoint table)."""
    if source == "cmdare":
        return "cmdare's own runs"
    if source.startswith("cmdare:"):
        return f"CM-DARE data ({source.split(':', 1)[1]} table)"
    return source


def distinct_sizes(sizes_mb: Any, rtol: float = SAME_SIZE_RTOL) -> int:
    """How many distinct sizes ``sizes_mb`` holds, counting sizes within ``rtol`` of the next as one."""
    s = np.sort(np.asarray(sizes_mb, float))
    if not len(s):
        return 0
    return 1 + int(np.sum(np.diff(s) > rtol * s[1:]))


def fit_duration(sub: Any, col: str) -> tuple[dict[str, Any], str]:
    """A linear fit of ``col`` on ``size_mb`` (a row of the fits table) and its note; with fewer than two
    distinct sizes or :data:`MIN_FIT_POINTS` points the fitted columns stay empty and the note says why."""
    n, sizes = len(sub), distinct_sizes(sub.size_mb)
    row: dict[str, Any] = {"points": n, "sizes": sizes, "intercept_s": np.nan, "s_per_mb": np.nan, "mape": np.nan}
    mean = float(sub[col].mean())
    if sizes < 2:
        note = (f"one checkpoint size only ({sub.size_mb.mean():.3g} MB): no size-duration fit; "
                f"mean duration {mean:.3g} s")
    elif n < MIN_FIT_POINTS:
        note = f"{n} checkpoints only: no size-duration fit; mean duration {mean:.3g} s"
    else:
        slope, icpt = np.polyfit(sub.size_mb, sub[col], 1)
        pred = icpt + slope * sub.size_mb
        mape = float(np.mean(np.abs(pred - sub[col]) / sub[col].clip(lower=1e-9)))
        row.update(intercept_s=float(icpt), s_per_mb=float(slope), mape=mape)
        note = f"{icpt:.3f} s + {slope * 1000:.2f} ms/MB (linear fit MAPE {mape:.1%})"
    return row, note


def build(store: Store, run_id: str | None = None) -> Report:
    """Per model: size, local and remote duration; per source, linear fits of duration on size."""
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
    sources = sorted(df.source.unique())
    for source in sources:
        for col, _ in DURATIONS:
            sub = df[(df.source == source) & df[col].notna()]
            if sub.empty:
                continue
            row, note = fit_duration(sub, col)
            fits.append({"source": source, "duration": col, **row, "note": note})
            notes.append(f"{source + ' ' if len(sources) > 1 else ''}{col[:-2]}: {note}")
    fit_df = pd.DataFrame(fits, columns=FIT_COLUMNS)

    def plot(fig: Any) -> None:
        ax = fig.subplots(1, 1)
        for source in sources:
            for col, label in DURATIONS:
                sub = df[(df.source == source) & df[col].notna()]
                if sub.empty:
                    continue
                name = f"{shown_source(source)}: {label}" if len(sources) > 1 else label
                pts = ax.scatter(sub.size_mb, sub[col], s=12, alpha=0.6, label=name)
                f = fit_df[(fit_df.source == source) & (fit_df.duration == col) & fit_df.s_per_mb.notna()]
                if len(f):
                    x = np.linspace(0, sub.size_mb.max() * 1.05, 50)
                    ax.plot(x, f.intercept_s.iloc[0] + f.s_per_mb.iloc[0] * x, "--", color=pts.get_facecolor()[0])
        ax.set(xlabel="checkpoint size (MB)", ylabel="duration (s)", title="dashed: linear fit per source")
        ax.legend()

    return Report(
        "checkpoint",
        "Checkpoint duration vs size",
        {"by_model": table, "fits": fit_df},
        notes,
        plot,
        figsize=(8, 5),
    )
