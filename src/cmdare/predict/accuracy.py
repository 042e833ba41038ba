"""Final test accuracy (and the accuracy curve) of asynchronous parameter-server training.

Asynchronous training with more workers is faster but applies staler gradients; revocations change
the membership mid-run. :class:`AccuracyModel` is a small saturating model::

    acc(step) = a_max - alpha * s**beta - R * rho(policy) - c * (step * B / B_ref)**(-d)

``s`` is the mean push staleness (global steps since the pulled parameters; ``workers - 1`` is its
proxy for homogeneous asynchronous workers when it was not measured), ``R`` the number of membership
changes (revocations) and ``rho`` their cost under the learning-rate policy (``unchanged``,
``linear``, ``sqrt``, ``staleness``; a policy the data never shows costs what ``unchanged`` costs,
and ``sqrt``/``staleness`` cost the mean of ``unchanged`` and ``linear``). ``B`` is the batch size, so
the last term is the not-yet-converged part of the curve over the samples seen. Parameters the data
cannot identify stay at their constructor values (e.g. the curve shape when every point has the same
step count; the published curve shape comes from CM-DARE's ``chief_rejoining`` baseline curves).

Data: the published ICAC 2019 points in ``accuracy_points.csv`` (every point's source and encoding
in its row), and cmdare's own runs in the measurement store (:func:`own_accuracy_rows`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

__all__ = [
    "ACCURACY_COLUMNS",
    "LR_POLICY_CODES",
    "AccuracyModel",
    "accuracy_model",
    "own_accuracy_rows",
    "published_accuracy_data",
    "published_curve_shape",
]

#: Feature columns of X, in order. ``lr_policy`` is a code from :data:`LR_POLICY_CODES`;
#: ``staleness`` may be NaN (then ``workers - 1``).
ACCURACY_COLUMNS = ("workers", "staleness", "batch_size", "steps", "lr_policy", "revocations")
#: Learning-rate policy names (as in ``cmdare.train.membership.LR_POLICIES``) -> feature codes.
LR_POLICY_CODES = {"unchanged": 0, "linear": 1, "sqrt": 2, "staleness": 3}
#: The published workload of the ICAC 2019 points.
PUBLISHED_WORKLOAD = "resnet32/cifar10"

_POINTS = Path(__file__).with_name("accuracy_points.csv")
# what a missing trailing column means: 1 worker, staleness from workers, batch 32, 1 step, unchanged LR
_DEFAULTS = np.array([1.0, np.nan, 32.0, 1.0, 0.0, 0.0])
# parameter vector: a_max, alpha, beta, c, d, rho_unchanged, rho_linear
_NAMES = ("a_max", "alpha", "beta", "c", "d", "rho_unchanged", "rho_linear")


def policy_code(name: str) -> int:
    """The feature code of a learning-rate policy name.

    Raises:
        UnknownNameError: for an unknown policy, listing the valid ones.
    """
    try:
        return LR_POLICY_CODES[name]
    except KeyError:
        from cmdare.errors import UnknownNameError

        raise UnknownNameError("learning-rate policy", name, list(LR_POLICY_CODES)) from None


class AccuracyModel(RegressorMixin, BaseEstimator):
    """Final test accuracy (a fraction) from :data:`ACCURACY_COLUMNS`.

    Args:
        use_staleness: False gives the baseline that ignores the number of workers and staleness.
        staleness_power: ``beta`` when it cannot be fitted (fewer than 3 staleness levels).
        curve_scale: ``c`` when the curve cannot be fitted (fewer than 3 distinct sample counts).
        curve_exponent: ``d`` likewise.
        ref_batch_size: ``B_ref`` (None: the median batch size of the training data).
        l2: weight of the pull of each fitted parameter towards its starting value (stability on
            a handful of points).
    """

    def __init__(self, use_staleness: bool = True, staleness_power: float = 1.0, curve_scale: float = 0.0,
                 curve_exponent: float = 0.5, ref_batch_size: float | None = None, l2: float = 1e-4):
        self.use_staleness = use_staleness
        self.staleness_power = staleness_power
        self.curve_scale = curve_scale
        self.curve_exponent = curve_exponent
        self.ref_batch_size = ref_batch_size
        self.l2 = l2

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN staleness means "not measured": workers - 1
        return tags

    # -- features --------------------------------------------------------------------------------
    @staticmethod
    def _columns(X: np.ndarray) -> tuple[np.ndarray, ...]:
        if X.shape[1] < len(_DEFAULTS):  # narrower X (sklearn's generic checks): documented defaults
            X = np.hstack([X, np.tile(_DEFAULTS[X.shape[1]:], (X.shape[0], 1))])
        workers, stale, batch, steps, policy, revs = X[:, : len(_DEFAULTS)].T
        stale = np.where(np.isnan(stale), np.maximum(workers - 1.0, 0.0), stale)
        for name, col in (("workers", workers), ("batch_size", batch), ("steps", steps), ("revocations", revs)):
            if not np.all(np.isfinite(col)):
                raise ValueError(f"{name} must be finite")
        batch, steps = np.maximum(batch, 1e-6), np.maximum(steps, 1.0)
        return workers, np.maximum(stale, 0.0), batch, steps, policy, np.maximum(revs, 0.0)

    @staticmethod
    def _rho(theta: np.ndarray, policy: np.ndarray) -> np.ndarray:
        rho_u, rho_l = theta[5], theta[6]
        mid = 0.5 * (rho_u + rho_l)
        return np.select([policy == 1, policy >= 2], [rho_l, mid], rho_u)

    def _curve(self, theta: np.ndarray, stale, batch, steps, policy, revs) -> np.ndarray:
        a_max, alpha, beta, c, d = theta[:5]
        x = steps * batch / self.ref_batch_size_
        drop = alpha * np.power(stale, beta) if self.use_staleness else 0.0
        return a_max - drop - revs * self._rho(theta, policy) - c * np.power(x, -d)

    # -- estimator -------------------------------------------------------------------------------
    def fit(self, X, y) -> AccuracyModel:
        """Least-squares fit of the identifiable parameters; returns self."""
        from scipy.optimize import least_squares

        X, y = validate_data(self, X, y, y_numeric=True, ensure_all_finite="allow-nan")
        _, stale, batch, steps, policy, revs = cols = self._columns(X)
        self.ref_batch_size_ = float(self.ref_batch_size or np.median(batch))
        if not self.ref_batch_size_ > 0:
            raise ValueError(f"ref_batch_size must be positive, got {self.ref_batch_size}")
        x = steps * batch / self.ref_batch_size_
        free = np.zeros(len(_NAMES), bool)
        free[0] = True
        levels = len(np.unique(stale))
        free[1] = self.use_staleness and levels >= 2
        free[2] = self.use_staleness and levels >= 3
        free[3] = free[4] = len(np.unique(np.round(x, 6))) >= 3
        changed = revs > 0
        free[5] = bool(np.any(changed & (policy != 1)))
        free[6] = bool(np.any(changed & (policy == 1)))
        theta0 = np.array([min(1.0, y.max() + 0.01), 0.01, self.staleness_power, self.curve_scale,
                           self.curve_exponent, 0.0, 0.0])
        lo = np.array([0.0, 0.0, 0.2, 0.0, 0.05, 0.0, 0.0])
        hi = np.array([1.0, 1.0, 3.0, 1e6, 3.0, 1.0, 1.0])
        theta0 = np.clip(theta0, lo + 1e-9, hi - 1e-9)

        def full(p: np.ndarray) -> np.ndarray:
            theta = theta0.copy()
            theta[free] = p
            if not free[6]:
                theta[6] = theta[5]  # no linear-policy data: no benefit assumed
            return theta

        def resid(p: np.ndarray) -> np.ndarray:
            pred = self._curve(full(p), *cols[1:])
            return np.concatenate([pred - y, np.sqrt(self.l2) * (p - theta0[free])])

        sol = least_squares(resid, theta0[free], bounds=(lo[free], hi[free]))
        self.theta_ = full(sol.x)
        self.params_ = dict(zip(_NAMES, map(float, self.theta_), strict=True))
        self.free_ = tuple(n for n, f in zip(_NAMES, free, strict=True) if f)
        self.n_samples_ = len(y)
        return self

    def predict(self, X) -> np.ndarray:
        """Predicted final test accuracy of each row, clipped to [0, 1]."""
        check_is_fitted(self, "theta_")
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan")
        _, *cols = self._columns(X)
        return np.clip(self._curve(self.theta_, *cols), 0.0, 1.0)

    def predict_curve(self, row, steps) -> np.ndarray:
        """Accuracy at each of ``steps`` for one configuration ``row`` (its revocations spread evenly
        over its ``steps`` column)."""
        check_is_fitted(self, "theta_")
        row = np.asarray(row, dtype=float).ravel()
        grid = np.asarray(steps, dtype=float).ravel()
        X = np.repeat(row[None, :], len(grid), axis=0)
        X[:, 3] = grid
        X[:, 5] = row[5] * np.minimum(grid / max(row[3], 1.0), 1.0)
        return self.predict(X)


def published_accuracy_data() -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """``(X, y, meta)`` of the published points (``meta``: point, workload, source, note)."""
    df = pd.read_csv(_POINTS)
    X = np.column_stack([
        df["workers"].to_numpy(float), pd.to_numeric(df["staleness"], errors="coerce").to_numpy(float),
        df["batch_size"].to_numpy(float), df["steps"].to_numpy(float),
        df["lr_policy"].map(policy_code).to_numpy(float), df["revocations"].to_numpy(float),
    ])
    meta = df[["point", "workload", "source", "note"]].assign(cnn=df["workload"], gpu="")
    return X, df["accuracy"].to_numpy(float), meta


@lru_cache(maxsize=1)
def published_curve_shape() -> dict[str, float]:
    """``curve_scale`` and ``curve_exponent`` for the published workload, fitted on the baseline
    test-accuracy curves of CM-DARE's ``chief_rejoining`` runs (CIFAR-10, 24k steps); the
    constructor defaults when a ``CMDARE_SHARED_DATA`` override lacks those files."""
    from scipy.optimize import curve_fit

    try:
        from cmdare.public_data import public_data_dir

        folder = public_data_dir() / "cmdare" / "chief_rejoining"
        frames = [pd.read_csv(folder / name) for name in ("base.csv", "base-1.csv")]
    except OSError:  # an override folder without chief_rejoining/: the defaults
        return {"curve_scale": 0.0, "curve_exponent": 0.5}
    df = pd.concat(frames)
    df = df[df["Step"] > 100]
    step, acc = df["Step"].to_numpy(float), df["Value"].to_numpy(float)
    # a - (step / s0)**-d, i.e. c = s0**d: well conditioned. The noisy curves fit d from 1 to 2 about
    # equally well (RMS 0.036 vs 0.035), so d is capped at 1 (learning curves rarely fall faster).
    (_, s0, d), _ = curve_fit(lambda s, a, s0, d: a - np.power(s / s0, -d), step, acc, p0=(0.85, 1000.0, 0.5),
                              bounds=([0, 1, 0.1], [1, 1e5, 1.0]), maxfev=20000)
    return {"curve_scale": float(s0**d), "curve_exponent": float(d)}


def own_accuracy_rows(store, curves: bool = False) -> pd.DataFrame:
    """cmdare's own finished runs in the store, one row per run: :data:`ACCURACY_COLUMNS`, ``accuracy``,
    ``workload`` (``model/dataset/lr=...``), ``run_id`` and ``final`` (True). Staleness is the measured
    mean; runs that recorded none (e.g. imported runs) are skipped. ``curves`` adds a row per
    evaluation before the end (``final`` False; revocations pro rata), so the curve shape can be fitted."""
    runs = store.frame("runs")
    runs = runs[(runs["status"] == "finished") & runs["final_accuracy"].notna()]
    stale = store.frame("staleness")
    rows = []
    for r in runs.itertuples():
        cfg = r.config if isinstance(r.config, dict) else {}
        part = stale[stale["run_id"] == r.run_id]
        if part.empty or "workers" not in cfg:
            continue
        mean_stale = float((part["staleness"] * part["count"]).sum() / max(part["count"].sum(), 1))
        summary = r.summary if isinstance(r.summary, dict) else {}
        lr = (cfg.get("optimizer") or {}).get("lr")
        rows.append({
            "workers": float(cfg["workers"]), "staleness": mean_stale,
            "batch_size": float(cfg.get("batch_size", 32)), "steps": float(r.final_step or cfg.get("steps", 0)),
            "lr_policy": float(LR_POLICY_CODES.get(cfg.get("lr_policy", "unchanged"), 0)),
            "revocations": float(summary.get("revocations", 0)), "accuracy": float(r.final_accuracy),
            "workload": f"{cfg.get('model')}/{cfg.get('dataset')}/lr={lr}", "run_id": r.run_id, "final": True,
        })
    cols = [*ACCURACY_COLUMNS, "accuracy", "workload", "run_id", "final"]
    out = pd.DataFrame(rows, columns=cols)
    if curves and len(out):
        evals = store.frame("eval_metrics")
        extra = []
        for r in out.itertuples():
            part = evals[(evals["run_id"] == r.run_id) & (evals["global_step"] < r.steps)]
            for e in part.itertuples():
                extra.append({**r._asdict(), "steps": float(e.global_step), "accuracy": float(e.accuracy),
                              "revocations": r.revocations * e.global_step / r.steps, "final": False})
        if extra:
            out = pd.concat([out, pd.DataFrame(extra)[cols]], ignore_index=True)
    return out


def accuracy_model(workload: str | None = None, db_url: str | None = None, curves: bool = False) -> AccuracyModel:
    """A fitted :class:`AccuracyModel`: on the published ResNet-32/CIFAR-10 points (default), or on
    cmdare's own runs of ``workload`` (``model/dataset/lr=...`` as in :func:`own_accuracy_rows`): their
    final accuracies, and with ``curves`` also their evaluations along the way (fits the curve shape,
    at some cost in final-accuracy error: the additive form is a compromise over the whole curve).

    Raises:
        DataNotFoundError: if the store has fewer than 2 runs of ``workload``.
    """
    if workload is None or workload == PUBLISHED_WORKLOAD:
        return _published_model()
    from cmdare.errors import DataNotFoundError
    from cmdare.measure.store.repository import open_store

    store = open_store(db_url)
    try:
        rows = own_accuracy_rows(store, curves=curves)
    finally:
        store.close()
    part = rows[rows["workload"] == workload]
    if part["final"].sum() < 2:
        known = sorted(set(rows["workload"]))
        raise DataNotFoundError(f"need at least 2 finished runs of {workload!r} in the store, have "
                                f"{int(part['final'].sum())}; "
                                f"workloads there: {', '.join(known) or 'none'}")
    return AccuracyModel().fit(part[list(ACCURACY_COLUMNS)].to_numpy(float), part["accuracy"].to_numpy(float))


@lru_cache(maxsize=1)
def _published_model() -> AccuracyModel:
    X, y, _ = published_accuracy_data()
    return AccuracyModel(**published_curve_shape()).fit(X, y)
