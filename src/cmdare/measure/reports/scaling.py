"""``cmdare report scaling``: cluster speed against the number of workers, per GPU type and #PS.

Each (GPU, model, #PS, #workers) run is summarized by the median global steps/s after dropping the
first 20% of its samples (warm-up). Samples of cmdare runs on emulated servers keep apart, their model
marked ``(emulated)``. The ideal line is #workers x the 1-worker speed. The PS is marked
saturated from the smallest cluster reaching 85% of the best speed, when the largest cluster stays
under 80% scaling efficiency (otherwise the curve is near-linear and nothing is marked).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cmdare.measure.reports.base import Report, require_rows
from cmdare.measure.store import Store

WARMUP_FRACTION = 0.2
KNEE_FRACTION = 0.85
SATURATED_EFFICIENCY = 0.8
EMULATED_MARK = " (emulated)"  # appended to the model of samples from cmdare runs on emulated servers


# The CM-DARE data's short model names -> the zoo's (what cmdare workloads, train and plan call them).
ZOO_NAME = {"res15": "t2t_resnet15", "res32": "t2t_resnet32", "shakesmall": "shake_shake_small",
            "shakemid": "shake_shake_mid", "shakebig": "shake_shake_large"}

def cluster_speeds(store: Store) -> Any:
    """Median steady-state steps/s per (gpu_type, model_name, ps, workers) from cluster speed samples."""
    import pandas as pd

    df = store.frame("cluster_speed_samples")
    require_rows(df, "cluster speed samples", store.url, "cmdare import cmdare DIR (CM-DARE's processed_data)")
    df = df[df.source != "cmdare:speed_data_base"]
    df["model_name"] = df.model_name.fillna(df.run_id).fillna("unknown")
    runs = store.frame("runs")
    emulated = set(runs.run_id[runs.emulated.astype(bool)]) if len(runs) else set()
    mark = df.run_id.isin(emulated)
    df.loc[mark, "model_name"] = df.model_name[mark] + EMULATED_MARK
    df["gpu_type"] = df.gpu_type.fillna("unknown")
    out = []
    for key, g in df.groupby(["gpu_type", "model_name", "ps", "workers", "import_id"], dropna=False):
        g = g.sort_values("step")
        steady = g.iloc[int(len(g) * WARMUP_FRACTION) :] if len(g) >= 5 else g
        out.append(
            dict(
                zip(["gpu_type", "model", "ps", "workers"], key[:4], strict=True),
                steps_per_s=float(steady.steps_per_s.median()),
                samples=len(g),
            )
        )
    res = (
        pd.DataFrame(out)
        .groupby(["gpu_type", "model", "ps", "workers"], as_index=False)
        .agg(steps_per_s=("steps_per_s", "mean"), samples=("samples", "sum"))
    )
    return res.sort_values(["gpu_type", "model", "ps", "workers"]).reset_index(drop=True)


def saturation(speeds: Any) -> Any:
    """Per (gpu_type, model, ps): efficiency at the largest cluster and where the PS saturates."""
    import pandas as pd

    rows = []
    for (gpu, model, ps), g in speeds.groupby(["gpu_type", "model", "ps"]):
        g = g.sort_values("workers")
        one = g[g.workers == 1].steps_per_s
        base = float(one.iloc[0]) if len(one) else float(g.steps_per_s.iloc[0] / g.workers.iloc[0])
        last = g.iloc[-1]
        eff = float(last.steps_per_s / (last.workers * base))
        knee = int(g[g.steps_per_s >= KNEE_FRACTION * g.steps_per_s.max()].workers.min())
        rows.append(
            {
                "gpu_type": gpu,
                "model": model,
                "ps": int(ps),
                "max_workers": int(last.workers),
                "speedup_at_max": float(last.steps_per_s / base),
                "efficiency_at_max": eff,
                "ps_saturates_at": knee if eff < SATURATED_EFFICIENCY else None,
            }
        )
    return pd.DataFrame(rows)


def build(store: Store, run_id: str | None = None) -> Report:
    """The scaling report from every cluster speed sample in the store."""
    speeds = cluster_speeds(store)
    sat = saturation(speeds)
    base = speeds[speeds.workers == 1].set_index(["gpu_type", "model", "ps"]).steps_per_s
    ideal = [float(base.get((r.gpu_type, r.model, r.ps), np.nan)) * r.workers for r in speeds.itertuples()]
    speeds["ideal_steps_per_s"] = ideal
    speeds["efficiency"] = speeds.steps_per_s / speeds.ideal_steps_per_s
    knees = sat.set_index(["gpu_type", "model", "ps"]).ps_saturates_at
    speeds["ps_saturated"] = [
        bool(k == k and k is not None and r.workers >= k)
        for r, k in zip(
            speeds.itertuples(),
            [knees.get((r.gpu_type, r.model, r.ps)) for r in speeds.itertuples()],
            strict=True,
        )
    ]
    notes = []
    for r in sat.itertuples():
        if r.ps_saturates_at is not None and r.ps_saturates_at == r.ps_saturates_at:
            notes.append(
                f"{r.gpu_type} {r.model} with {r.ps} PS: flattens from {int(r.ps_saturates_at)} workers "
                f"(efficiency {r.efficiency_at_max:.0%} at {r.max_workers})"
            )
        else:
            notes.append(
                f"{r.gpu_type} {r.model} with {r.ps} PS: near-linear up to {r.max_workers} workers "
                f"(efficiency {r.efficiency_at_max:.0%})"
            )
    emulated = sorted({m for m in speeds.model if m.endswith(EMULATED_MARK)})
    if emulated:
        notes.append(f"{', '.join(emulated)}: cmdare runs on emulated servers; their speed was measured on the "
                     "machine they ran on, not on the GPU type shown")
    gpus = sorted(speeds.gpu_type.unique())

    def plot(fig: Any) -> None:
        axes = np.atleast_1d(fig.subplots(1, len(gpus), squeeze=False)[0])
        for ax, gpu in zip(axes, gpus, strict=True):
            sub = speeds[speeds.gpu_type == gpu]
            top = 1
            for (model, ps), g in sub.groupby(["model", "ps"]):
                g = g.sort_values("workers")
                base1 = g.ideal_steps_per_s / g.workers
                speedup = g.steps_per_s / base1
                line = ax.plot(g.workers, speedup, "o-", ms=3, label=f"{ZOO_NAME.get(model, model)} ({ps} PS)")[0]
                knee = knees.get((gpu, model, ps))
                if knee is not None and knee == knee:
                    k = g[g.workers == knee]
                    ax.plot(
                        k.workers,
                        (k.steps_per_s / (k.ideal_steps_per_s / k.workers)),
                        "X",
                        ms=10,
                        color=line.get_color(),
                    )
                top = max(top, int(g.workers.max()))
            ax.plot([1, top], [1, top], "k--", lw=1, label="ideal (linear)")
            ax.set(title=f"{gpu.upper()}: X = PS saturates", xlabel="workers", ylabel="speedup over 1 worker")
            ax.legend(fontsize=7)

    return Report(
        "scaling",
        "Cluster speed vs number of workers",
        {"speeds": speeds, "saturation": sat},
        notes,
        plot,
        figsize=(6.0 * len(gpus), 4.5),
    )
