"""Prediction intervals: split-conformal on out-of-sample log errors, calibrated per honest protocol.

For each target the calibration pool is the set of out-of-sample log ratios ``log(measured /
predicted)`` of cmdare's model under the protocol that matches the question: step time on a GPU
type seen in training - leave-one-CNN-out; on an unseen GPU type - leave-one-GPU-out; cluster speed
and checkpoint time - leave-one-CNN-out. The interval at level ``q`` is
``prediction * exp(+-r_q)`` with ``r_q`` the ``ceil((n + 1) q) / n`` empirical quantile of the
absolute log ratios (split conformal). :func:`coverage` checks it honestly: each held-out group
(CNN or GPU type) is covered by an ``r_q`` computed from the other groups' errors only.

The planner draws one speed factor per simulated run from the signed pool (:func:`speed_factor`),
so its P95 carries model error as well as revocation randomness.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

__all__ = [
    "POOLS",
    "POOL_WORDS",
    "calibration_pools",
    "coverage",
    "format_interval",
    "interval",
    "pool_quantile",
    "speed_factor",
    "step_pool",
]

# pool name -> what its interval was calibrated on, in words (what a user reads)
POOL_WORDS = {
    "step_seen": "errors on models left out, GPU types measured",
    "step_unseen": "errors on GPU types left out",
    "cluster": "errors on models left out",
    "checkpoint_remote": "errors on models left out",
    "checkpoint_local": "errors on models left out",
}
# pool name -> (task, protocol)
POOLS = {
    "step_seen": ("step_time", "loco"),
    "step_unseen": ("step_time", "logo"),
    "cluster": ("cluster_speed", "loco"),
    "checkpoint_remote": ("checkpoint_remote", "loco"),
    "checkpoint_local": ("checkpoint_local", "loco"),
}


def _oos(task: str, protocol: str) -> tuple[np.ndarray, np.ndarray]:
    """Signed out-of-sample log ratios of cmdare's model and the held-out group of each."""
    from cmdare.predict.evaluate import TASKS, cross_predict, task_data

    X, y, meta = task_data(task)
    factory = next(iter(TASKS[task].models.values()))
    rows, pred = cross_predict(factory(), X, y, meta, protocol, TASKS[task].repeats)
    key = meta["cnn" if protocol == "loco" else "gpu"].to_numpy()[rows]
    return np.log(y[rows] / np.maximum(pred, 1e-12)), key


@lru_cache(maxsize=1)
def calibration_pools() -> dict[str, list[float]]:
    """Signed log ratios per pool (see :data:`POOLS`), cached under the models directory."""
    import json

    from cmdare.predict import _cache_dir, _fingerprint

    path = _cache_dir() / "intervals.json"
    try:
        saved = json.loads(path.read_text())
        if saved.get("data_fingerprint") == _fingerprint() and set(saved["pools"]) == set(POOLS):
            return saved["pools"]
    except (OSError, ValueError, KeyError):
        pass
    pools = {name: _oos(task, protocol)[0].tolist() for name, (task, protocol) in POOLS.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"data_fingerprint": _fingerprint(), "pools": pools}))
    except OSError:
        pass
    return pools


def pool_quantile(residuals, level: float) -> float:
    """Split-conformal half-width (log units) at ``level`` from signed log ratios."""
    from cmdare.errors import UserInputError

    if not 0 < level < 1:
        raise UserInputError(f"interval level must be between 0 and 1, got {level}")
    r = np.sort(np.abs(np.asarray(residuals, dtype=float)))
    if r.size == 0:
        return math.inf
    k = math.ceil((r.size + 1) * level)
    return float(r[min(k, r.size) - 1]) if k <= r.size else float(r[-1])


def interval(prediction: float, pool: str, level: float = 0.9) -> tuple[float, float]:
    """``(low, high)`` around ``prediction`` from calibration pool ``pool`` at ``level``."""
    half = pool_quantile(calibration_pools()[pool], level)
    return prediction * math.exp(-half), prediction * math.exp(half)


def coverage(task: str, protocol: str, level: float = 0.9) -> dict[str, float]:
    """Empirical coverage of the intervals under ``protocol``: each held-out group is judged with a
    half-width calibrated on the other groups' out-of-sample errors. Returns the fraction covered
    overall and per group kind (``all``, and each group)."""
    r, key = _oos(task, protocol)
    covered = np.zeros(len(r), bool)
    for g in np.unique(key):
        half = pool_quantile(r[key != g], level)
        covered[key == g] = np.abs(r[key == g]) <= half
    out = {"all": float(covered.mean())}
    out.update({str(g): float(covered[key == g].mean()) for g in np.unique(key)})
    return out


def speed_factor(rng: np.random.Generator, unseen_gpu: bool) -> float:
    """A multiplicative speed error for one simulated run: ``exp(r)`` with ``r`` drawn from the
    cluster-speed pool, plus one from the unseen-GPU step-time pool when the cluster has a GPU type
    the models never measured (the speed is ``1 / time``, so the signs flip)."""
    pools = calibration_pools()
    r = float(rng.choice(np.asarray(pools["cluster"])))
    if unseen_gpu:
        r -= float(rng.choice(np.asarray(pools["step_unseen"])))
    return math.exp(r)


def step_pool(gpu_tflops: float) -> str:
    """``step_seen`` if the fitted step-time model has its own coefficients for this GPU, else
    ``step_unseen``."""
    from cmdare.predict import step_time_model

    model = step_time_model()
    seen = np.abs(np.asarray(model.gpu_tflops_, dtype=float) - gpu_tflops) <= model.tflops_tol
    return "step_seen" if bool(seen.any()) else "step_unseen"


def format_interval(value: float, low: float, high: float, unit: str, level: float) -> str:
    """``0.2140 s/step (90% interval 0.1990-0.2300)``."""
    return f"{value:.4g} {unit} ({level:.0%} interval {low:.4g}-{high:.4g})"
