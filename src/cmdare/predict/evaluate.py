"""Evaluation protocols: every model beside its published baseline, on the same splits.

Protocols: ``random`` (80/20 split repeated over seeds 0..R-1, errors pooled over the repeats),
``kfold`` (10-fold, shuffled, seed 0), ``loco`` (leave one CNN out: a model never seen in
training), ``logo`` (leave one GPU type out) and ``loo`` (leave one configuration out, for cluster
speed and the published accuracy points). Errors: MAE (target units), MAPE (%) and the largest
absolute percentage error (%), overall and per GPU type where the task has one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.model_selection import KFold, train_test_split

from cmdare.predict import data as _data
from cmdare.predict.checkpoint import CheckpointModel, SizeOnlyRegression
from cmdare.predict.cluster_speed import CLUSTER_COLUMNS, OptimusModel, PSQueueModel, SumOfWorkers
from cmdare.predict.features import CHECKPOINT_COLUMNS, INDEX_KB_PER_TENSOR, STEP_COLUMNS
from cmdare.predict.step_time import FlopsRatioLinear, PerGPUFlopsRegression, StepTimeModel

__all__ = ["TASKS", "Task", "evaluate", "evaluate_task", "metrics", "task_data"]


@dataclass(frozen=True)
class Task:
    """One prediction target with its models (first = cmdare's, second = published baseline)."""

    name: str
    target: str
    unit: str
    models: dict[str, Callable[[], object]]
    protocols: tuple[str, ...]
    main_protocol: str
    repeats: int = 20


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "step_time",
            "Step Time (s)",
            "s",
            {
                "cmdare StepTimeModel": StepTimeModel,
                "cmdare StepTimeModel, one roofline for every GPU (before issue 45)":
                    lambda: StepTimeModel(unseen="roofline"),
                "cmdare StepTimeModel, TFLOPS only (the earlier form)": lambda: StepTimeModel(unseen="tflops"),
                "published SVR on normalized FLOPs (per GPU)": lambda: PerGPUFlopsRegression("svr"),
                "published linear on normalized FLOPs (per GPU)": lambda: PerGPUFlopsRegression("linear"),
                "published linear on FLOPs/TFLOPS": FlopsRatioLinear,
            },
            ("random", "kfold", "loco", "logo"),
            "loco",
        ),
        Task(
            "cluster_speed",
            "Speed (steps/sec)",
            "steps/s",
            {
                "cmdare PSQueueModel": PSQueueModel,
                "sum of workers": SumOfWorkers,
                "Optimus f(p,w)": OptimusModel,
            },
            ("loo", "random", "kfold", "loco", "logo"),
            "loo",
            repeats=10,
        ),
        Task(
            "checkpoint_remote",
            "Duration",
            "s",
            {
                "cmdare CheckpointModel": CheckpointModel,
                "published SVR on size": lambda: SizeOnlyRegression("svr"),
                "published linear on size": lambda: SizeOnlyRegression("linear"),
            },
            ("random", "kfold", "loco"),
            "random",
            repeats=50,
        ),
        Task(
            "checkpoint_local",
            "Local duration",
            "s",
            {
                "cmdare CheckpointModel": CheckpointModel,
                "published SVR on size": lambda: SizeOnlyRegression("svr"),
                "published linear on size": lambda: SizeOnlyRegression("linear"),
            },
            ("random", "kfold", "loco"),
            "random",
            repeats=50,
        ),
        Task(
            "accuracy",
            "Final test accuracy",
            "fraction",
            {
                "cmdare AccuracyModel": lambda: _accuracy_model(True),
                "baseline ignoring workers": lambda: _accuracy_model(False),
            },
            ("loo",),
            "loo",
        ),
    )
}


def _accuracy_model(use_staleness: bool):
    from cmdare.predict.accuracy import AccuracyModel, published_curve_shape

    return AccuracyModel(use_staleness=use_staleness, **published_curve_shape())


def task_data(name: str) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """``(X, y, meta)`` of a task; ``meta`` has columns ``cnn`` and ``gpu`` (may be empty)."""
    if name == "step_time":
        df = _data.load_single_gpu_speed()
        cols, meta = STEP_COLUMNS, df[["cnn", "gpu"]]
    elif name == "cluster_speed":
        df = _data.load_cluster_speed()
        cols, meta = CLUSTER_COLUMNS, df[["cnn", "gpu", "Workers"]]
    elif name == "accuracy":
        from cmdare.predict.accuracy import published_accuracy_data

        X, y, meta = published_accuracy_data()
        return X, y, meta[["cnn", "gpu", "point"]]
    elif name.startswith("checkpoint"):
        df = _data.load_checkpoint().copy()
        df["Number of Tensors"] = df["Number of Tensors"].fillna(df["Index File Size"] / INDEX_KB_PER_TENSOR)
        cols, meta = CHECKPOINT_COLUMNS, df[["Model"]].rename(columns={"Model": "cnn"}).assign(gpu="")
    else:
        from cmdare.errors import UnknownNameError

        raise UnknownNameError("model task", name, list(TASKS))
    return df[list(cols)].to_numpy(float), df[TASKS[name].target].to_numpy(float), meta.reset_index(drop=True)


def metrics(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """MAE, MAPE (%) and max absolute percentage error (%)."""
    ape = np.abs(pred - y) / np.abs(y) * 100
    return {
        "mae": float(np.mean(np.abs(pred - y))),
        "mape": float(ape.mean()),
        "max_ape": float(ape.max()),
        "n": int(len(y)),
    }


def _splits(protocol: str, meta: pd.DataFrame, repeats: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    idx = np.arange(len(meta))
    if protocol == "random":
        for seed in range(repeats):
            yield tuple(train_test_split(idx, test_size=0.2, random_state=seed))  # type: ignore[misc]
    elif protocol == "kfold":
        yield from KFold(10, shuffle=True, random_state=0).split(idx)
    elif protocol in ("loco", "logo"):
        key = meta["cnn" if protocol == "loco" else "gpu"].to_numpy()
        for value in pd.unique(key):
            yield idx[key != value], idx[key == value]
    elif protocol == "loo":
        for i in idx:
            yield idx[idx != i], idx[idx == i]
    else:
        from cmdare.errors import UnknownNameError

        raise UnknownNameError("protocol", protocol, ["random", "kfold", "loco", "logo", "loo"])


def cross_predict(
    model, X: np.ndarray, y: np.ndarray, meta: pd.DataFrame, protocol: str, repeats: int = 20
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-sample predictions under a protocol: ``(test row indices, predictions)``, pooled."""
    rows, preds = [], []
    for train, test in _splits(protocol, meta, repeats):
        fresh = clone(model)
        if protocol == "logo" and "held_out_gpus" in fresh.get_params():
            fresh.set_params(held_out_gpus=tuple(pd.unique(meta["gpu"].to_numpy()[test])))
        fitted = fresh.fit(X[train], y[train])
        rows.append(test)
        preds.append(fitted.predict(X[test]))
    return np.concatenate(rows), np.concatenate(preds)


def evaluate_task(
    name: str, protocols: tuple[str, ...] | None = None, models: tuple[str, ...] | None = None
) -> tuple[pd.DataFrame, dict]:
    """Errors of every model of a task under each protocol, overall and per GPU.

    Returns:
        A frame with task, model, protocol, subset, mae, mape, max_ape, n; and the pooled
        out-of-sample predictions ``{(model, protocol): (y_true, y_pred, meta_rows)}`` for plots.
    """
    task = TASKS[name]
    X, y, meta = task_data(name)
    out, preds = [], {}
    gpus = [g for g in pd.unique(meta["gpu"]) if g]
    for model_name, factory in task.models.items():
        if models and model_name not in models:
            continue
        for protocol in protocols or task.protocols:
            if protocol == "logo" and len(gpus) < 2:
                continue
            rows, pred = cross_predict(factory(), X, y, meta, protocol, task.repeats)
            preds[(model_name, protocol)] = (y[rows], pred, meta.iloc[rows].reset_index(drop=True))
            subsets = {"all": np.ones(len(rows), bool)}
            subsets.update({g: meta["gpu"].to_numpy()[rows] == g for g in gpus})
            for subset, mask in subsets.items():
                out.append(
                    {
                        "task": name,
                        "model": model_name,
                        "protocol": protocol,
                        "subset": subset,
                        **metrics(y[rows][mask], pred[mask]),
                    }
                )
    return pd.DataFrame(out), preds


def evaluate(tasks: tuple[str, ...] | None = None,
             on_task: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, dict]:
    """:func:`evaluate_task` over several tasks (default: all); frames concatenated. ``on_task(name)`` is
    called as each task starts (progress)."""
    frames, preds = [], {}
    for name in tasks or tuple(TASKS):
        if on_task is not None:
            on_task(name)
        frame, p = evaluate_task(name)
        frames.append(frame)
        preds.update({(name, *k): v for k, v in p.items()})
    return pd.concat(frames, ignore_index=True), preds


def plot_files(plot_dir, tasks) -> list[Path]:
    """The files :func:`plot_predictions` and :func:`plot_cluster_scaling` may write for ``tasks``."""
    names = [f"models_{name}.png" for name in tasks] + (["models_cluster_scaling.png"] if "cluster_speed" in tasks
                                                         else [])
    return [Path(plot_dir).expanduser() / name for name in names]


def plot_predictions(preds: dict, plot_dir, force: bool = False) -> list:
    """Predicted-vs-measured scatter plots, one per task (main protocol, cmdare vs baselines), written into
    ``plot_dir`` (created if missing) as :func:`cmdare.output_files.open_output` writes: none replaced unless
    ``force``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cmdare.output_files import output_dir, save_figure

    plot_dir = output_dir(plot_dir, "--plot-dir")
    written = []
    for name, task in TASKS.items():
        keys = [k for k in preds if k[0] == name and k[2] == task.main_protocol]
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(5.5, 5))
        lo, hi = np.inf, 0.0
        for _, model_name, protocol in keys:
            y, p, _ = preds[(name, model_name, protocol)]
            mape = float(np.mean(np.abs(p - y) / y) * 100)
            ax.scatter(y, p, s=12, alpha=0.6, label=f"{model_name} ({mape:.1f}%)")
            lo, hi = min(lo, y.min(), p.min()), max(hi, y.max(), p.max())
        lo = max(lo, 1e-3)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {task.target}" + ("" if f"({task.unit})" in task.target else f" [{task.unit}]"))
        ax.set_ylabel(f"predicted [{task.unit}]")
        ax.set_title(f"{name}, protocol {task.main_protocol} (MAPE)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = save_figure(fig, plot_dir / f"models_{name}.png", "--plot-dir", force, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_cluster_scaling(plot_dir, force: bool = False) -> Path:
    """Measured steps/s vs workers (1 PS) with cmdare's leave-one-configuration-out predictions
    and its 2-PS prediction, one panel per GPU type (``models_cluster_scaling.png`` in ``plot_dir``, as
    :func:`plot_predictions` writes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cmdare.output_files import output_dir, save_figure
    from cmdare.predict.cluster_speed import PSQueueModel

    X, y, meta = task_data("cluster_speed")
    rows, pred = cross_predict(PSQueueModel(), X, y, meta, "loo")
    loo = np.empty(len(y))
    loo[rows] = pred
    full = PSQueueModel().fit(X, y)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, gpu in zip(axes, ("K80", "P100"), strict=True):
        for k, cnn in enumerate(pd.unique(meta["cnn"])):
            m = ((meta["gpu"] == gpu) & (meta["cnn"] == cnn)).to_numpy()
            w = meta["Workers"].to_numpy()[m]
            color = f"C{k}"
            ax.plot(w, y[m], "o", color=color, label=f"{cnn} measured")
            ax.plot(w, loo[m], "-", color=color, label=f"{cnn} predicted (held out)")
            X2 = X[m].copy()
            X2[:, 4] = 2
            ax.plot(w, full.predict(X2), ":", color=color, label=f"{cnn} 2 PS (predicted)")
        ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_ylabel("global steps/s")
        ax.set_title(f"{gpu}, 1 PS: measured vs PSQueueModel")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path = save_figure(fig, output_dir(plot_dir, "--plot-dir") / "models_cluster_scaling.png", "--plot-dir", force,
                       dpi=110)
    plt.close(fig)
    return path


def evaluate_startup() -> pd.DataFrame:
    """Startup model per (GPU, region, transient): measured mean total vs the fitted model's mean,
    and vs a model fitted with that group held out (it then answers from partial pooling)."""
    from cmdare.predict.startup import PHASES, StartupModel

    df = _data.load_startup()
    full = StartupModel().fit(df)
    rows = []
    for (gpu, region, transient), part in df.groupby(["gpu", "region", "transient"]):
        measured = float(part[list(PHASES)].sum(axis=1).mean())
        held_out = StartupModel().fit(df.drop(part.index))
        model = sum(full.mean_s(gpu, bool(transient), region).values())
        pred = sum(held_out.mean_s(gpu, bool(transient), region).values())
        rows.append(
            {
                "gpu": gpu,
                "region": region,
                "transient": bool(transient),
                "n": len(part),
                "measured_total_s": measured,
                "model_total_s": model,
                "held_out_total_s": pred,
                "held_out_ape": abs(pred - measured) / measured * 100,
            }
        )
    return pd.DataFrame(rows)
