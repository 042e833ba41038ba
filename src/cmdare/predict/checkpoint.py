"""Checkpoint time models: local save, and save + upload to a cloud bucket.

``X`` has :data:`cmdare.predict.features.CHECKPOINT_COLUMNS`: checkpoint size (MB) and #tensors
(NaN allowed: then a size-only model answers).

``CheckpointModel`` (cmdare) is a linear backbone ``a + b * size + c * tensors`` (a per-file fixed
cost, the write / upload bandwidth, a per-variable cost of TensorFlow's index and metadata) plus an
RBF SVR fitted on its residuals (tube 5% of the median time, the measurement noise), which
captures the flat region of small checkpoints (the upload's fixed cost dominates) yet extrapolates
linearly to large checkpoints where a pure SVR goes flat.
Baselines: CM-DARE's SVR on checkpoint size (published 5.38% MAPE) and linear regression (7.98%).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVR
from sklearn.utils.validation import check_is_fitted, validate_data

from cmdare.predict.features import fixed_width

__all__ = ["CheckpointModel", "SizeOnlyRegression"]


class _LinearPlusSVR(RegressorMixin, BaseEstimator):
    def __init__(self, C: float = 10.0, epsilon: float = 0.05):
        self.C = C
        self.epsilon = epsilon

    def fit(self, X, y):
        self.base_ = LinearRegression().fit(X, y)
        self.residual_ = make_pipeline(StandardScaler(), SVR(C=self.C, epsilon=self.epsilon))
        self.residual_.fit(X, y - self.base_.predict(X))
        return self

    def predict(self, X):
        return self.base_.predict(X) + self.residual_.predict(X)


class CheckpointModel(RegressorMixin, BaseEstimator):
    """cmdare's checkpoint-time model (see module docstring).

    Args:
        C: regularization of the residual SVR.
        epsilon_rel: tube width of the residual SVR as a fraction of the median target; errors
            within the tube are ignored. 5% matches the repeat-to-repeat noise of one checkpoint
            (coefficient of variation 2-8% in ``aggregated.csv``), so the SVR does not chase noise.
    """

    def __init__(self, C: float = 10.0, epsilon_rel: float = 0.05):
        self.C = C
        self.epsilon_rel = epsilon_rel

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN #tensors means "unknown": the size-only model answers
        return tags

    def fit(self, X, y):
        """Fit the size+tensors model on rows that know #tensors and a size-only one on all rows."""
        X, y = validate_data(self, X, y, y_numeric=True, ensure_all_finite="allow-nan")
        X = fixed_width(X, 2, np.nan)
        if np.isnan(X[:, 0]).any():
            raise ValueError("checkpoint size must not be NaN")
        # The training rows are the model's parameters (an SVR's support vectors are a subset of
        # them): kept so the model can be saved as plain JSON and rebuilt exactly by refitting.
        self.X_fit_, self.y_fit_ = X.copy(), y.copy()
        epsilon = self.epsilon_rel * max(float(np.median(np.abs(y))), 1e-9)
        proto = _LinearPlusSVR(C=self.C, epsilon=epsilon)
        self.size_model_ = clone(proto).fit(X[:, :1], y)
        known = ~np.isnan(X[:, 1])
        self.full_model_ = clone(proto).fit(X[known], y[known]) if known.sum() >= 3 else None
        return self

    def predict(self, X):
        """Seconds to write (and, for a remote model, upload) each checkpoint."""
        check_is_fitted(self, "size_model_")
        X = fixed_width(validate_data(self, X, reset=False, ensure_all_finite="allow-nan"), 2, np.nan)
        if np.isnan(X[:, 0]).any():
            raise ValueError("checkpoint size must not be NaN")
        out = self.size_model_.predict(X[:, :1])
        known = ~np.isnan(X[:, 1])
        if self.full_model_ is not None and known.any():
            out[known] = self.full_model_.predict(X[known])
        return out


class SizeOnlyRegression(RegressorMixin, BaseEstimator):
    """CM-DARE's baselines on checkpoint size alone: ``svr`` (RBF, defaults) or ``linear``."""

    def __init__(self, kind: str = "svr"):
        self.kind = kind

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def fit(self, X, y):
        """Fit on the size column; returns self."""
        X, y = validate_data(self, X, y, y_numeric=True, ensure_all_finite="allow-nan")
        if self.kind not in ("svr", "linear"):
            from cmdare.errors import UnknownNameError

            raise UnknownNameError("baseline kind", self.kind, ["svr", "linear"])
        self.model_ = (SVR() if self.kind == "svr" else LinearRegression()).fit(np.nan_to_num(X[:, :1]), y)
        return self

    def predict(self, X):
        """Seconds per checkpoint."""
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan")
        return self.model_.predict(np.nan_to_num(X[:, :1]))
