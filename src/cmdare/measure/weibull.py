"""Weibull lifetimes with no deadline: the spot markets' model (AWS Spot, GCE Spot), by interruption rate or fitted."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cmdare.errors import UserInputError
from cmdare.measure.lifetime_models import LifetimeModel, _as_array, _censor_mask

__all__ = ["SpotLifetime"]


class SpotLifetime(LifetimeModel):
    """Weibull lifetimes with no deadline: F(t) = 1 - exp(-(t / scale_s) ** shape); shape 1 is exponential."""

    def __init__(self, shape: float = 1.0, scale_s: float | None = None):
        self.shape_, self.scale_s_ = float(shape), scale_s
        self.meta = {}

    @property
    def name(self) -> str:  # type: ignore[override]
        return "exponential" if self.shape_ == 1.0 else "weibull"

    @classmethod
    def from_rate(cls, fraction: float, period_s: float, shape: float = 1.0) -> SpotLifetime:
        """The model with ``P(revoked within period_s) = fraction``."""
        return cls(shape, period_s / (-math.log1p(-fraction)) ** (1.0 / shape))

    def is_fitted(self) -> bool:
        return self.scale_s_ is not None

    def fit(self, lifetimes_s: Any, censored: Any = None) -> SpotLifetime:
        """Right-censored maximum likelihood of shape and scale (Nelder-Mead on their logs)."""
        from scipy.optimize import minimize

        t = np.maximum(_as_array(lifetimes_s), 1e-9)
        events = ~_censor_mask(censored, t.size)
        if not events.any():
            raise UserInputError("a Weibull fit needs at least one revocation (every lifetime is censored)")

        def nll(p: np.ndarray) -> float:
            k, lam = np.exp(p)
            z = t / lam
            return float(-(np.sum(np.log(k / lam) + (k - 1) * np.log(z[events]))) + np.sum(z ** k))

        start = np.log([1.0, t.sum() / events.sum()])
        k, lam = np.exp(minimize(nll, start, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9}).x)
        self.shape_, self.scale_s_ = float(k), float(lam)
        return self

    def cdf(self, t_s: Any) -> np.ndarray:
        self._check_fitted()
        t = np.maximum(np.asarray(t_s, dtype=float), 0.0)
        return 1.0 - np.exp(-((t / self.scale_s_) ** self.shape_))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        self._check_fitted()
        return self.scale_s_ * rng.weibull(self.shape_, size)

    def params(self) -> dict[str, Any]:
        return {"shape": self.shape_, "scale_s": self.scale_s_}

    def mean_s(self, rng_seed: int = 0, n: int = 20_000) -> float:
        """Mean lifetime in seconds (closed form)."""
        self._check_fitted()
        return float(self.scale_s_ * math.gamma(1.0 + 1.0 / self.shape_))
