"""Refining the speed models with the user's own runs (``cmdare models fit --from-store``).

The public-data models stay the prior. For each GPU type the user trained on (the store's worker
``gpu_type``) two factors of the model's own structure are fitted: ``exp(u)`` scales the single-worker
step time (the cluster's GPUs are faster or slower) and ``exp(v)`` the PS service time in the closed
queueing network (its host and network saturate earlier or later). They are fitted on log speed by
least squares with a ridge pull towards 0 (= the prior), so a single run moves them only part of the way. The prior is
:func:`cmdare.predict.speed_with_scales` for the run's workload (profiled from cmdare's zoo),
workers, PS and placement. The held-out error (leave one run out) is reported before and after; the
factors are saved beside the cached models and apply to every speed and step-time prediction for
that GPU type while they exist (``cmdare models fit`` without ``--from-store`` removes them).

Only runs whose speed was measured on the servers they name are used: a run the store marks ``emulated``
(a local stand-in for cloud servers, or real servers revoked by injection) is skipped, and so is a run
whose model no longer imports or profiles here; :func:`speed_runs` says which runs were left out and why.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pandas as pd

from cmdare.errors import CmdareError

__all__ = [
    "RIDGE",
    "demand_scale",
    "fit_speed_refinement",
    "load_refinement",
    "own_speed_rows",
    "refinement_note",
    "speed_runs",
    "usable_runs",
    "step_scale",
    "run_features",
    "zoo_workload_features",
]

RIDGE = 0.05  # pull of each log factor towards 0 (the prior), against squared log errors of the runs
_FILE = "speed_refinement.json"


#: Why a finished run of the store is not used by the speed refinement (a reason names it to the user).
SKIP_EMULATED = "emulated (local stand-ins for cloud servers, or injected revocations): not a speed of its servers"
SKIP_NO_STEPS = "no step measurements"
SKIP_UNFINISHED = "not finished"


def speed_runs(store) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The store's own runs usable for the speed refinement, with their measured cluster speed (steps/s: the
    sum over workers of 1 / median step time of each worker, chunks after the first 20%), and the runs left
    out by reason (``{reason: [run ids]}``): emulated, not finished, no step measurements."""
    from cmdare.predict.store_data import PUBLIC_SOURCE_PREFIX

    runs = store.frame("runs")
    runs = runs[~runs["source"].astype(str).str.startswith(PUBLIC_SOURCE_PREFIX)]
    steps = store.frame("step_metrics")
    servers = store.frame("servers")
    rows, skipped = [], {}
    for run in runs.itertuples():
        cfg = run.config or {}
        part = steps[(steps["run_id"] == run.run_id) & (steps["steps"] > 0)]
        reason = (SKIP_EMULATED if bool(run.emulated) else SKIP_UNFINISHED if run.status != "finished"
                  else SKIP_NO_STEPS if part.empty or not cfg.get("model") else None)
        if reason is not None:
            skipped.setdefault(reason, []).append(str(run.run_id))
            continue
        rates = []
        for _, w in part.groupby("worker_id"):
            per_step = (w["duration_s"] / w["steps"]).to_numpy(float)
            per_step = per_step[len(per_step) // 5 :] if len(per_step) >= 5 else per_step
            rates.append(1.0 / float(np.median(per_step)))
        workers = [s for s in servers[servers["run_id"] == run.run_id].itertuples() if s.role == "worker"]
        gpu = next((str(s.gpu_type) for s in workers if isinstance(s.gpu_type, str)), str(cfg.get("gpu") or "k80"))
        n = int(cfg.get("workers") or len(rates)) if str(cfg.get("workers", "")).isdigit() else len(rates)
        rows.append({
            "run_id": run.run_id, "model": str(cfg["model"]), "dataset": str(cfg.get("dataset") or ""),
            "gpu": gpu.lower(), "workers": n,
            "ps": int(cfg.get("ps") or 1), "placement": str(cfg.get("placement") or "round-robin"),
            "batch_size": _batch_size(cfg), "speed": float(sum(sorted(rates, reverse=True)[:n])),
        })
    columns = ["run_id", "model", "dataset", "gpu", "workers", "ps", "placement", "batch_size", "speed"]
    return pd.DataFrame(rows, columns=columns), skipped


def _batch_size(cfg: dict) -> int:
    """The run's per-worker batch size (train's default where its config does not say)."""
    from cmdare.option_values import DEFAULT_BATCH_SIZE

    value = cfg.get("batch_size")
    usable = isinstance(value, int | float) and not isinstance(value, bool) and value >= 1
    return int(value) if usable else DEFAULT_BATCH_SIZE


def own_speed_rows(store) -> pd.DataFrame:
    """The rows of :func:`speed_runs` (finished, measured, not emulated runs of the store)."""
    return speed_runs(store)[0]


def usable_runs(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict, dict[str, list[str]]]:
    """``rows`` whose network can be profiled here, its features by ``(model, dataset)``, and the rest by
    reason (``{"model does not load here: <why>": [run ids]}``): a past run's package that no longer imports,
    a zoo model since renamed, a model the profiler cannot trace. Never raises for one run's model."""
    feats: dict = {}
    skipped: dict[str, list[str]] = {}
    keep = []
    for r in rows.itertuples():
        key = (r.model, r.dataset)
        if key not in feats:
            try:
                feats[key] = run_features(*key)
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's code may raise anything
                feats[key] = f"model does not load here: {_first_line(err)}"
        if isinstance(feats[key], str):
            skipped.setdefault(feats[key], []).append(str(r.run_id))
        else:
            keep.append(r.Index)
    return rows.loc[keep], {k: v for k, v in feats.items() if not isinstance(v, str)}, skipped


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def zoo_workload_features(model: str):
    """:class:`~cmdare.predict.WorkloadFeatures` of zoo model ``model`` from cmdare's profiler."""
    from cmdare.predict.workloads import WorkloadFeatures
    from cmdare.workloads import profile_model

    p = profile_model(model)
    return WorkloadFeatures(model, model, float(p.flops_per_sample_train), p.num_params, p.num_tensors,
                            p.checkpoint_bytes / 1e6, source="cmdare zoo profiler")


def run_features(model: str, dataset: str = ""):
    """Features of a recorded run's network: a zoo model's profile at CIFAR's shape; your own model, trained on
    your own data (both import paths), profiled on one sample of that data (its code must import here).

    Raises:
        UserInputError: your code does not import here (the message names the path and the node).
    """
    from cmdare.tasks import is_builtin_dataset
    from cmdare.workloads.import_path import is_import_path

    if not (is_import_path(model) and is_import_path(dataset)) or is_builtin_dataset(dataset):
        return zoo_workload_features(model)
    from cmdare.predict.workloads import module_features
    from cmdare.tasks import build_task

    task = build_task(model, dataset)
    x, _ = next(task.stream(0, 1, 1, 0))
    return module_features(model, task.build(), tuple(x.shape[1:]))


def _fit_scales(prior, rows: pd.DataFrame, ridge: float) -> np.ndarray:
    """``(u, v)`` minimizing squared log errors of ``rows`` plus ``ridge * (u^2 + v^2)``."""
    from scipy.optimize import least_squares

    y = np.log(rows["speed"].to_numpy(float))

    def resid(theta):
        pred = np.array([np.log(max(prior(r, *np.exp(theta)), 1e-12)) for r in rows.itertuples()])
        return np.concatenate([pred - y, np.sqrt(ridge) * theta])

    return least_squares(resid, np.zeros(2), bounds=(-5.0, 5.0)).x


def _mape(y, p) -> float:
    return float(np.mean(np.abs(np.asarray(p) - np.asarray(y)) / np.asarray(y)) * 100)


def fit_speed_refinement(rows: pd.DataFrame, speed_with_scales, ridge: float = RIDGE,
                         features: dict | None = None) -> dict:
    """Factors per GPU type from :func:`own_speed_rows`, with leave-one-run-out errors of the prior
    and of the refined model (``None`` with fewer than two runs of that GPU type).

    Args:
        speed_with_scales: the public-data model, :func:`cmdare.predict.speed_with_scales`.
        features: the networks' features by ``(model, dataset)`` (:func:`usable_runs`); default profiled here.
    """
    out: dict = {"ridge": ridge, "gpus": {}}
    if rows.empty:
        return out
    if features is None:
        pairs = rows[["model", "dataset"]].drop_duplicates().itertuples(index=False)
        features = {(m, d): run_features(m, d) for m, d in pairs}

    def prior(r, step: float = 1.0, demand: float = 1.0) -> float:
        batch = int(getattr(r, "batch_size", 0) or 0) or None  # rows of an older store: train's default
        return speed_with_scales(features[r.model, r.dataset], {r.gpu: int(r.workers)}, int(r.ps), _known(r.placement),
                                 step_scales={r.gpu: step}, demand_scale=demand, batch_size=batch)

    for gpu in sorted(rows["gpu"].unique()):
        part = rows[rows["gpu"] == gpu].reset_index(drop=True)
        try:
            out["gpus"][gpu] = _fit_gpu(prior, part, ridge)
        except (CmdareError, ValueError, FloatingPointError) as err:  # a GPU type unknown here, a prior not finite
            out.setdefault("failed", {})[gpu] = f"{len(part)} run(s) not fitted: {_first_line(err)}"
    return out


def _fit_gpu(prior, part: pd.DataFrame, ridge: float) -> dict:
    """One GPU type's factors and held-out errors (:func:`fit_speed_refinement`)."""
    before = after = None
    if len(part) >= 2:
        y = part["speed"].to_numpy(float)
        base = [prior(r) for r in part.itertuples()]
        held = []
        for i, r in enumerate(part.itertuples()):
            u, v = _fit_scales(prior, part.drop(index=i), ridge)
            held.append(prior(r, np.exp(u), np.exp(v)))
        before, after = _mape(y, base), _mape(y, held)
    u, v = _fit_scales(prior, part, ridge)
    return {
        "log_step_scale": float(u),
        "log_demand_scale": float(v),
        "runs": int(len(part)),
        "heldout_mape_prior": before,
        "heldout_mape_refined": after,
    }


def _known(placement: str) -> str:
    from cmdare.predict.ps_load import PLACEMENT_NAMES

    return placement if placement in PLACEMENT_NAMES else "psld"


def _path():
    from cmdare.paths import models_dir

    return models_dir() / "predict" / _FILE


def save_refinement(refinement: dict, store_url: str | None) -> None:
    """Write the refinement beside the cached models."""
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**refinement, "store": str(store_url or "default")}, indent=1))
    load_refinement.cache_clear()


@lru_cache(maxsize=1)
def load_refinement() -> dict | None:
    """The saved refinement, or None."""
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("gpus") else None


def _entry(gpu: str) -> dict | None:
    return ((load_refinement() or {}).get("gpus") or {}).get(str(gpu).lower())


def step_scale(gpu: str) -> float:
    """Factor on the single-GPU step time of ``gpu`` (1.0 without a refinement)."""
    e = _entry(gpu)
    return 1.0 if e is None else float(np.exp(e["log_step_scale"]))


def demand_scale(counts) -> float:
    """Factor on the PS service time for workers ``counts`` (``{gpu: n}``): the workers'
    geometric mean of their GPU types' factors (1.0 without a refinement)."""
    logs = [(n, (_entry(g) or {}).get("log_demand_scale", 0.0)) for g, n in counts.items()]
    total = sum(n for n, _ in logs)
    return float(np.exp(sum(n * v for n, v in logs) / max(total, 1)))


def refinement_note() -> str:
    """Which speed models predictions use, for reports."""
    ref = load_refinement()
    if ref is None:
        return "speed models: public CM-DARE data"
    parts = []
    for gpu, e in ref["gpus"].items():
        err = (f", held-out MAPE {e['heldout_mape_prior']:.1f}% -> {e['heldout_mape_refined']:.1f}%"
               if e.get("heldout_mape_refined") is not None else "")
        parts.append(f"{gpu.upper()} from {e['runs']} own run(s){err}")
    return f"speed models: public CM-DARE data refined with the store's runs ({'; '.join(parts)}; store {ref['store']})"
