"""Single-GPU step time models: the published baselines and cmdare's structured model.

All take ``X`` with the columns of :data:`cmdare.predict.features.STEP_COLUMNS`
(GPU TFLOPS, Model FLOPs, #parameters, #tensors, worker-PS latency in ms) and predict seconds per
step. Rows with the same GPU TFLOPS value are one GPU type.

``StepTimeModel`` (cmdare) is a sum of physically meaningful non-negative terms, fitted by
non-negative least squares on relative error:

    t = a_g + b_g * FLOPs + c_g * tensors  +  dL * (l0 + l1 * params)

per GPU type g seen in training (fixed per-step overhead, compute time, per-tensor kernel and
update overhead), plus the latency term (dL = latency above the 0.3 ms of the same-zone
measurements; round trips and the bandwidth-delay-limited transfer of the parameters).

An unseen GPU is answered from its spec sheet (``unseen="roofline"``, default) by the pooled
roofline form, fitted on every training row::

    t = k0 / B + k1 * tensors / P + d * params + e_c * F_c / P + e_m * M_m / B + latency term

``F_c`` are the FLOPs of the step's compute-bound operators and ``M_m`` the DRAM bytes of its
memory-bound ones at this GPU's ridge ``P / B`` (:mod:`cmdare.predict.op_profile`); ``P`` is the
FP32 peak (the catalog's figure), ``B`` the memory bandwidth (``cmdare.cloud.gpu_specs``). The
per-step GPU overhead (small elementwise kernels: input, loss, bookkeeping) scales with the
bandwidth, the per-tensor work (a chain of small kernels per variable) with the FP32 rate, and the
parameter transfer to and from the PS with neither. ``unseen="tflops"`` keeps the form before the
spec sheet, ``a + (a' + b * FLOPs + c * tensors) / TFLOPS + d * params``. Splitting "a seen GPU"
from "an unseen GPU" lets each GPU keep its own efficiency.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression
from sklearn.svm import SVR
from sklearn.utils.validation import check_is_fitted, validate_data

from cmdare.predict.features import fixed_width

__all__ = ["FlopsRatioLinear", "PerGPUFlopsRegression", "StepTimeModel"]

_G = 1e9  # FLOPs unit in the design matrices (keeps NNLS well conditioned)
_M = 1e6  # parameter unit
_H = 100.0  # tensor unit
_REF_LATENCY_MS = 0.3  # worker-PS latency of the 0-latency table


_P_UNIT = 1e13  # FLOP/s (10 TFLOPS) of the roofline overhead columns
_B_UNIT = 700e9  # bytes/s of the same
_UNSEEN_FORMS = ("generations", "roofline", "tflops")


def gpu_bandwidth_for_tflops(tflops: float) -> float:
    """Memory bandwidth (bytes/s) of the catalog GPU whose FP32 TFLOPS is ``tflops``; for a TFLOPS
    value no catalog GPU has, the spec sheet's median bytes per FLOP times ``tflops``."""
    spec = spec_for_tflops(tflops)
    return spec.memory_bw_gbs * 1e9 if spec is not None else float(tflops) * 1e12 * _median_bytes_per_flop()


@lru_cache(maxsize=1)
def _median_bytes_per_flop() -> float:
    from cmdare.cloud.gpu_specs import gpu_specs

    return float(np.median([s.memory_bw_gbs * 1e9 / (s.fp32_tflops * 1e12) for s in gpu_specs().values()]))


def roofline_features(X: np.ndarray) -> np.ndarray:
    """Columns ``1/B, tensors/P, params, F_c/P, M_m/B`` (units: see module) for rows of ``STEP_COLUMNS``."""
    from cmdare.predict.op_profile import op_profile_for, roofline_split

    out = np.empty((len(X), 5))
    cache: dict[tuple, tuple[float, float]] = {}
    for i, (tf, flops, params, tensors, _lat) in enumerate(X[:, :5]):
        peak = max(abs(tf), 1e-6) * 1e12
        bw = max(gpu_bandwidth_for_tflops(abs(tf)), 1.0)
        flops, params, tensors = (max(abs(float(v)), 1.0) for v in (flops, params, tensors))
        key = (round(flops), round(params), round(tensors), peak, bw)
        if key not in cache:
            cache[key] = roofline_split(op_profile_for(flops, params, tensors), peak, bw)
        fc, mm = cache[key]
        out[i] = (_B_UNIT / bw, tensors / _H * _P_UNIT / peak, params / _M, fc / peak, mm / bw)
    return out


def _weights(y: np.ndarray) -> np.ndarray:
    return 1.0 / np.maximum(np.abs(y), 1e-9)


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    w = _weights(y)
    coef, _ = nnls(X * w[:, None], y * w, maxiter=50 * X.shape[1])
    return coef


class StepTimeModel(RegressorMixin, BaseEstimator):
    """cmdare's structured step-time model (see module docstring).

    Args:
        min_rows_per_gpu: rows a GPU type needs in training to get its own coefficients.
        min_workloads_per_gpu: distinct workloads a GPU type needs for the same.
        tflops_tol: two TFLOPS values closer than this are the same GPU type.
        unseen: form for a GPU type not seen in training: ``generations`` (the cross-generation model of
            :mod:`cmdare.predict.generations` for a catalog GPU, else ``roofline``), ``roofline`` (spec sheet, one
            set of efficiencies) or ``tflops``.
        held_out_gpus: GPU types the cross-generation model must not learn from (leave-one-GPU-out evaluation).
    """

    def __init__(
        self,
        min_rows_per_gpu: int = 10,
        min_workloads_per_gpu: int = 4,
        tflops_tol: float = 1e-3,
        unseen: str = "generations",
        held_out_gpus: tuple[str, ...] = (),
    ):
        self.min_rows_per_gpu = min_rows_per_gpu
        self.min_workloads_per_gpu = min_workloads_per_gpu
        self.tflops_tol = tflops_tol
        self.unseen = unseen
        self.held_out_gpus = held_out_gpus

    @staticmethod
    def _parts(X: np.ndarray) -> tuple[np.ndarray, ...]:
        tf = np.maximum(np.abs(X[:, 0]), 1e-6)
        # latency above the 0.3 ms of the same-zone measurements, in units of 10 ms
        lat = np.maximum(X[:, 4] - _REF_LATENCY_MS, 0.0) / 10.0
        return tf, X[:, 1] / _G, X[:, 2] / _M, X[:, 3] / _H, lat

    def _pooled_design(self, X: np.ndarray) -> np.ndarray:
        tf, g, p, t, lat = self._parts(X)
        if self.unseen in ("roofline", "generations"):
            return np.column_stack([roofline_features(X), lat, lat * p])
        if self.unseen != "tflops":
            from cmdare.errors import UnknownNameError

            raise UnknownNameError("unseen-GPU form", self.unseen, list(_UNSEEN_FORMS))
        one = np.ones(len(X))
        return np.column_stack([one, one / tf, g / tf, t / tf, p, lat, lat * p])

    def _gpu_design(self, X: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        _, g, p, t, lat = self._parts(X)
        cols = []
        for k in range(len(self.gpu_tflops_)):
            m = (gpu == k).astype(float)
            cols += [m, m * g, m * t]
        return np.column_stack([*cols, lat, lat * p])

    def _gpu_index(self, tf: np.ndarray) -> np.ndarray:
        idx = np.full(len(tf), -1)
        for k, ref in enumerate(self.gpu_tflops_):
            idx[np.abs(tf - ref) <= self.tflops_tol] = k
        return idx

    def fit(self, X, y):
        """Fit both the per-GPU and the pooled (TFLOPS-scaled) forms; returns self."""
        X, y = validate_data(self, X, y, y_numeric=True)
        X = fixed_width(X, 5)
        self.pooled_coef_ = _nnls(self._pooled_design(X), y)
        known = []
        for tf in np.unique(X[:, 0]):
            rows = np.abs(X[:, 0] - tf) <= self.tflops_tol
            if rows.sum() >= self.min_rows_per_gpu and len(np.unique(X[rows, 1])) >= self.min_workloads_per_gpu:
                known.append(float(tf))
        self.gpu_tflops_ = np.array(known, dtype=float)
        if len(known):
            gpu = self._gpu_index(X[:, 0])
            rows = gpu >= 0
            self.gpu_coef_ = _nnls(self._gpu_design(X[rows], gpu[rows]), y[rows])
        else:
            self.gpu_coef_ = np.zeros(2)
        return self

    def predict(self, X):
        """Seconds per step for each row."""
        check_is_fitted(self, "pooled_coef_")
        X = fixed_width(validate_data(self, X, reset=False), 5)
        design = self._pooled_design(X)
        out = design @ self.pooled_coef_
        if self.unseen == "generations":
            self._generation_rows(X, design, out)
        if len(self.gpu_tflops_):
            gpu = self._gpu_index(X[:, 0])
            rows = gpu >= 0
            if rows.any():
                out[rows] = self._gpu_design(X[rows], gpu[rows]) @ self.gpu_coef_
        return out


    def _generation_rows(self, X: np.ndarray, design: np.ndarray, out: np.ndarray) -> None:
        """Answer rows of a catalog GPU from the cross-generation model (plus this model's latency term). A GPU
        older than every measured generation keeps the pooled roofline: the nearest (newer) generation's
        efficiencies overstate it (leave-one-GPU-out on K80: 21.6% this way, 11.9% pooled)."""
        from cmdare.predict.generations import generation_step_model
        from cmdare.predict.op_profile import op_profile_for

        model = generation_step_model(tuple(sorted(g.upper() for g in self.held_out_gpus)))
        latency = design[:, -2:] @ self.pooled_coef_[-2:]
        for i, (tf, flops, params, tensors, _lat) in enumerate(X[:, :5]):
            spec = spec_for_tflops(float(tf))
            if spec is None or spec.generation < min(model.generations_):
                continue
            flops, params, tensors = (max(abs(float(v)), 1.0) for v in (flops, params, tensors))
            profile = op_profile_for(flops, params, tensors)
            out[i] = model.predict(profile, spec, int(params), int(round(tensors))) + latency[i]


def spec_for_tflops(tflops: float):
    """The spec sheet entry of the catalog GPU whose FP32 TFLOPS (as the catalog gives it) is ``tflops``, else None."""
    return _spec_table().get(round(float(tflops), 3))


@lru_cache(maxsize=1)
def _spec_table() -> dict:
    from cmdare.cloud.catalog import gpu_tflops
    from cmdare.cloud.gpu_specs import gpu_specs

    return {round(gpu_tflops(name), 3): spec for name, spec in gpu_specs().items()}


class PerGPUFlopsRegression(RegressorMixin, BaseEstimator):
    """CM-DARE's baseline: one regression per GPU type on min-max normalized model FLOPs.

    Args:
        kind: ``svr`` (published: SVR, RBF kernel) or ``linear``.
        C: SVR regularization.
        epsilon: SVR tube width in seconds.
    """

    def __init__(self, kind: str = "svr", C: float = 1.0, epsilon: float = 0.01):
        self.kind = kind
        self.C = C
        self.epsilon = epsilon

    def _make(self):
        if self.kind == "svr":
            return SVR(kernel="rbf", C=self.C, epsilon=self.epsilon)
        if self.kind == "linear":
            return LinearRegression()
        from cmdare.errors import UnknownNameError

        raise UnknownNameError("baseline kind", self.kind, ["svr", "linear"])

    def fit(self, X, y):
        """Fit one regressor per distinct GPU TFLOPS; returns self."""
        X, y = validate_data(self, X, y, y_numeric=True)
        X = fixed_width(X, 5)
        self.flops_min_, self.flops_max_ = float(X[:, 1].min()), float(X[:, 1].max())
        self.gpu_tflops_ = np.unique(X[:, 0])
        self.models_ = [self._make().fit(self._norm(X[X[:, 0] == tf]), y[X[:, 0] == tf]) for tf in self.gpu_tflops_]
        return self

    def _norm(self, X: np.ndarray) -> np.ndarray:
        span = max(self.flops_max_ - self.flops_min_, 1e-12)
        return ((X[:, 1] - self.flops_min_) / span).reshape(-1, 1)

    def predict(self, X):
        """Seconds per step; a GPU not seen in training uses the nearest GPU's model by TFLOPS."""
        check_is_fitted(self, "models_")
        X = fixed_width(validate_data(self, X, reset=False), 5)
        out = np.empty(len(X))
        nearest = np.abs(X[:, [0]] - self.gpu_tflops_[None, :]).argmin(axis=1)
        for k, model in enumerate(self.models_):
            rows = nearest == k
            if rows.any():
                out[rows] = model.predict(self._norm(X[rows]))
        return out


class FlopsRatioLinear(RegressorMixin, BaseEstimator):
    """CM-DARE's cross-GPU baseline: linear regression on model FLOPs / GPU TFLOPS."""

    def fit(self, X, y):
        """Fit ``t = a + b * FLOPs / TFLOPS``; returns self."""
        X, y = validate_data(self, X, y, y_numeric=True)
        X = fixed_width(X, 5)
        self.lr_ = LinearRegression().fit(self._ratio(X), y)
        return self

    @staticmethod
    def _ratio(X: np.ndarray) -> np.ndarray:
        return (X[:, 1] / _G / np.maximum(np.abs(X[:, 0]), 1e-6)).reshape(-1, 1)

    def predict(self, X):
        """Seconds per step."""
        check_is_fitted(self, "lr_")
        X = fixed_width(validate_data(self, X, reset=False), 5)
        return self.lr_.predict(self._ratio(X))
