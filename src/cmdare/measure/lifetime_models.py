"""Lifetime models of transient servers: how long a spot/preemptible server lives before revocation.

Three models, registered by name (:data:`LIFETIME_MODELS`):

- ``exponential``: constant revocation rate, F(t) = 1 - exp(-t / mean_s) (right-censoring aware MLE);
- ``bathtub``: the constrained-preemption model of Kadupitiya et al. (HPDC 2020),
  F(t) = A (1 - exp(-t / tau1) + exp((t - b) / tau2)), clipped to [0, 1], with b near the 24 h deadline
  of GCE preemptible VMs: early revocations (tau1), a quiet middle, and a wall at the deadline (tau2);
- ``empirical``: the (Kaplan-Meier when censored) empirical CDF itself.

Every model has ``fit(lifetimes_s, censored=None) -> self``, ``cdf(t_s)``, ``sample(rng, size)`` (seconds)
and ``to_dict()`` / :func:`model_from_dict`. :func:`load_lifetime_model` is what the revocation injector
and the planner call: ``"bathtub"``, ``"bathtub:k80"``, a saved JSON model or a lifetimes CSV.
Default parameters are fitted on the shared public data (``cmdare report lifetimes --save-defaults``)
and shipped as ``measure/data/lifetime_defaults.json``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cmdare.errors import DataFormatError, DataNotFoundError, UnknownNameError, UserInputError

DEADLINE_S = 24 * 3600.0  # GCE preemptible VMs are stopped after at most 24 h
DEFAULTS_PATH = Path(__file__).parent / "data" / "lifetime_defaults.json"
DEFAULT_KEY = "default"


def _as_array(values: Any, name: str = "lifetimes_s") -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise UserInputError(f"{name} is empty: need at least one lifetime")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise UserInputError(f"{name} must be finite and non-negative")
    return arr


def _censor_mask(censored: Any, n: int) -> np.ndarray:
    if censored is None:
        return np.zeros(n, dtype=bool)
    mask = np.asarray(censored, dtype=bool).ravel()
    if mask.size != n:
        raise UserInputError(f"censored has {mask.size} values for {n} lifetimes")
    return mask


def empirical_cdf(lifetimes_s: Any, censored: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Step points of the empirical CDF (Kaplan-Meier when some lifetimes are censored).

    Returns:
        ``(t, F)``: sorted distinct times and the CDF value just after each.
    """
    t = _as_array(lifetimes_s)
    cens = _censor_mask(censored, t.size)
    order = np.argsort(t, kind="stable")
    t, cens = t[order], cens[order]
    uniq, first = np.unique(t, return_index=True)
    events = np.add.reduceat((~cens).astype(float), first)
    totals = np.add.reduceat(np.ones_like(t), first)
    at_risk = t.size - np.concatenate([[0], np.cumsum(totals)[:-1]])
    surv = np.cumprod(1.0 - events / at_risk)
    return uniq, 1.0 - surv


def ks_distance(model: LifetimeModel, lifetimes_s: Any, censored: Any = None) -> float:
    """Kolmogorov-Smirnov distance: max |F_model - F_empirical| over both sides of every step."""
    t, f_hi = empirical_cdf(lifetimes_s, censored)
    f_lo = np.concatenate([[0.0], f_hi[:-1]])
    fm = model.cdf(t)
    fm_lo = model.cdf(np.nextafter(t, -np.inf))  # the model's left limit (matters for step models)
    return float(max(np.max(np.abs(fm - f_hi)), np.max(np.abs(fm_lo - f_lo))))


class LifetimeModel(ABC):
    """A lifetime distribution of transient servers (seconds)."""

    name: ClassVar[str]

    @abstractmethod
    def fit(self, lifetimes_s: Any, censored: Any = None) -> LifetimeModel:
        """Fit to observed lifetimes; ``censored[i]`` True means server i was not revoked (still alive)."""

    @abstractmethod
    def cdf(self, t_s: Any) -> np.ndarray:
        """Probability that a server is revoked by time ``t_s`` (seconds)."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw lifetimes in seconds."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The fitted parameters (JSON-able)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description: ``{"model": name, "params": {...}}`` plus fit metadata."""
        return {"model": self.name, "params": self.params(), **({"meta": self.meta} if self.meta else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LifetimeModel:
        """Rebuild a model saved with :meth:`to_dict`."""
        return model_from_dict(data)

    meta: dict[str, Any]

    def _check_fitted(self) -> None:
        if not self.is_fitted():
            raise UserInputError(f"{self.name} lifetime model is not fitted: call fit() first")

    @abstractmethod
    def is_fitted(self) -> bool:
        """True once the model has parameters."""

    def mean_s(self, rng_seed: int = 0, n: int = 20_000) -> float:
        """Mean lifetime in seconds (Monte Carlo on :meth:`sample`)."""
        return float(np.mean(self.sample(np.random.default_rng(rng_seed), n)))


class ExponentialLifetime(LifetimeModel):
    """Constant revocation rate: F(t) = 1 - exp(-t / mean_s)."""

    name = "exponential"

    def __init__(self, mean_s: float | None = None):
        self.mean_s_ = mean_s
        self.meta = {}

    def is_fitted(self) -> bool:
        return self.mean_s_ is not None

    def fit(self, lifetimes_s: Any, censored: Any = None) -> ExponentialLifetime:
        t = _as_array(lifetimes_s)
        events = int((~_censor_mask(censored, t.size)).sum())
        # MLE with right censoring: total exposure time / number of revocations.
        self.mean_s_ = float(t.sum() / max(events, 1))
        return self

    def cdf(self, t_s: Any) -> np.ndarray:
        self._check_fitted()
        t = np.maximum(np.asarray(t_s, dtype=float), 0.0)
        return 1.0 - np.exp(-t / self.mean_s_)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        self._check_fitted()
        return rng.exponential(self.mean_s_, size)

    def params(self) -> dict[str, Any]:
        return {"mean_s": self.mean_s_}


class BathtubLifetime(LifetimeModel):
    """F(t) = A (1 - exp(-t/tau1) + exp((t - b)/tau2)), clipped to [0, 1]; b is the deadline.

    ``fit`` starts from a least-squares fit of the empirical CDF and then minimizes the
    Kolmogorov-Smirnov distance directly (Nelder-Mead). ``b`` may move within ``b_range_s`` of the
    nominal 24 h deadline: measured lifetimes run from the insert request, so deadline stops land a
    little after 24 h. The CDF is clipped at 1, and any mass F leaves unassigned at ``max_s`` (the
    longest lifetime the model allows) is placed there, as the deadline stops everything.
    """

    name = "bathtub"

    def __init__(
        self,
        A: float | None = None,
        tau1_s: float | None = None,
        tau2_s: float | None = None,
        b_s: float = DEADLINE_S,
        b_range_s: tuple[float, float] = (DEADLINE_S, DEADLINE_S + 3600.0),
        max_s: float | None = None,
    ):
        self.A_, self.tau1_s_, self.tau2_s_, self.b_s_ = A, tau1_s, tau2_s, b_s
        self.b_range_s = tuple(b_range_s)
        self.max_s_ = max_s
        self.meta = {}

    def is_fitted(self) -> bool:
        return self.A_ is not None

    @staticmethod
    def _raw(p: np.ndarray, t: np.ndarray) -> np.ndarray:
        a, tau1, tau2, b = p
        with np.errstate(over="ignore"):
            return np.clip(a * (1.0 - np.exp(-t / tau1) + np.exp((t - b) / tau2)), 0.0, 1.0)

    def fit(self, lifetimes_s: Any, censored: Any = None) -> BathtubLifetime:
        from scipy.optimize import least_squares, minimize

        t, f_hi = empirical_cdf(lifetimes_s, censored)
        f_lo = np.concatenate([[0.0], f_hi[:-1]])
        b_lo, b_hi = self.b_range_s
        lower, upper = [1e-3, 1.0, 1.0, b_lo], [1.0, 1e7, 1e6, max(b_hi, b_lo + 1.0)]

        def ks(p: np.ndarray) -> float:
            if not all(lo <= v <= hi for v, lo, hi in zip(p, lower, upper, strict=True)):
                return 2.0
            f = self._raw(p, t)
            return float(max(np.max(np.abs(f - f_hi)), np.max(np.abs(f - f_lo))))

        best: tuple[float, np.ndarray] | None = None
        # Data-driven starts too: A near the CDF's plateau just before the deadline, tau1 near the
        # median early lifetime (the wall alone can otherwise trap the search).
        plateau = float(np.interp(b_lo - 3600.0, t, f_hi))
        early = t[t < b_lo - 3600.0]
        tau1_data = float(np.median(early)) if early.size else 3600.0
        starts = [
            (a, tau1, tau2)
            for a in (0.5, min(max(plateau, 0.02), 0.98))
            for tau1 in (600.0, 4 * 3600.0, max(tau1_data, 60.0))
            for tau2 in (300.0, 3000.0)
        ]
        for a, tau1, tau2 in starts:
            for b0 in (b_lo + 0.25 * (b_hi - b_lo),):
                p0 = np.array([a, tau1, tau2, b0])
                res = least_squares(
                    lambda p: self._raw(p, t) - f_hi, p0, x_scale=p0, bounds=(lower, upper), max_nfev=200
                )
                score = ks(res.x)
                if best is None or score < best[0]:
                    best = (score, res.x)
        assert best is not None
        opt = minimize(ks, best[1], method="Nelder-Mead", options={"maxiter": 3000, "xatol": 1e-4, "fatol": 1e-6})
        p = opt.x if opt.fun < best[0] else best[1]
        self.A_, self.tau1_s_, self.tau2_s_, self.b_s_ = (float(v) for v in p)
        self.max_s_ = float(max(t.max(), self.b_s_))
        return self

    def cdf(self, t_s: Any) -> np.ndarray:
        self._check_fitted()
        t = np.asarray(t_s, dtype=float)
        f = self._raw(np.array([self.A_, self.tau1_s_, self.tau2_s_, self.b_s_]), np.maximum(t, 0.0))
        return np.where(t >= self._max(), 1.0, f)

    def _max(self) -> float:
        return float(self.max_s_ if self.max_s_ is not None else self.b_s_ + 5 * self.tau2_s_)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        self._check_fitted()
        grid = np.linspace(0.0, self._max(), 8193)
        f = np.maximum.accumulate(self.cdf(grid[:-1]))
        f = np.concatenate([f, [1.0]])
        u = rng.uniform(0.0, 1.0, size)
        # Invert F on the grid; flat parts resolve to their first time. Mass left at max_s stays there.
        return np.interp(u, f, grid)

    def params(self) -> dict[str, Any]:
        return {
            "A": self.A_,
            "tau1_s": self.tau1_s_,
            "tau2_s": self.tau2_s_,
            "b_s": self.b_s_,
            "max_s": self.max_s_,
            "b_range_s": list(self.b_range_s),
        }


class EmpiricalLifetime(LifetimeModel):
    """The empirical CDF (Kaplan-Meier when censored); survivors' mass sits at the longest lifetime."""

    name = "empirical"
    MAX_POINTS = 2000  # keep saved models small: quantiles of larger samples

    def __init__(self, t_s: list[float] | None = None, cdf: list[float] | None = None):
        self.t_s_ = None if t_s is None else np.asarray(t_s, dtype=float)
        self.cdf_ = None if cdf is None else np.asarray(cdf, dtype=float)
        self.meta = {}

    def is_fitted(self) -> bool:
        return self.t_s_ is not None

    def fit(self, lifetimes_s: Any, censored: Any = None) -> EmpiricalLifetime:
        t, f = empirical_cdf(lifetimes_s, censored)
        if t.size > self.MAX_POINTS:
            idx = np.unique(np.linspace(0, t.size - 1, self.MAX_POINTS).round().astype(int))
            t, f = t[idx], f[idx]
        f[-1] = 1.0  # whoever survived the observation window is revoked at its end
        self.t_s_, self.cdf_ = t, f
        return self

    def cdf(self, t_s: Any) -> np.ndarray:
        self._check_fitted()
        t = np.asarray(t_s, dtype=float)
        idx = np.searchsorted(self.t_s_, t, side="right") - 1
        return np.where(idx >= 0, self.cdf_[np.clip(idx, 0, None)], 0.0)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        self._check_fitted()
        u = rng.uniform(0.0, 1.0, size)
        idx = np.searchsorted(self.cdf_, u, side="left")
        return self.t_s_[np.clip(idx, 0, self.t_s_.size - 1)]

    def params(self) -> dict[str, Any]:
        return {"t_s": [float(x) for x in self.t_s_], "cdf": [float(x) for x in self.cdf_]}


LIFETIME_MODELS: dict[str, type[LifetimeModel]] = {
    cls.name: cls for cls in (ExponentialLifetime, BathtubLifetime, EmpiricalLifetime)
}


def make_lifetime_model(name: str, **params: Any) -> LifetimeModel:
    """An unfitted (or parameterized) model by registry name."""
    try:
        cls = LIFETIME_MODELS[name]
    except KeyError:
        raise UnknownNameError("lifetime model", name, LIFETIME_MODELS) from None
    return cls(**params)


def model_from_dict(data: dict[str, Any]) -> LifetimeModel:
    """Rebuild a model from :meth:`LifetimeModel.to_dict` output."""
    if not isinstance(data, dict) or "model" not in data:
        raise DataFormatError("a saved lifetime model is a JSON object with 'model' and 'params'")
    params = dict(data.get("params") or {})
    if "b_range_s" in params:
        params["b_range_s"] = tuple(params["b_range_s"])
    try:
        model = make_lifetime_model(data["model"], **params)
    except TypeError as err:
        raise DataFormatError(f"bad parameters for lifetime model {data['model']!r}: {err}") from err
    model.meta = dict(data.get("meta") or {})
    return model


def load_defaults() -> dict[str, dict[str, Any]]:
    """The shipped default models: ``{name: {key: model_dict}}``, keys such as default, k80, cpu."""
    if not DEFAULTS_PATH.exists():
        raise DataNotFoundError(f"default lifetime models missing: {DEFAULTS_PATH}")
    return json.loads(DEFAULTS_PATH.read_text())


def load_lifetime_model(spec: str) -> LifetimeModel:
    """A ready-to-sample lifetime model from a spec.

    Args:
        spec: a registry name with default parameters fitted on the public data (``"bathtub"``,
            ``"exponential:k80"``, ``"empirical:cpu"``; keys: see :func:`load_defaults`), a path to a
            JSON model saved with ``to_dict``, or a lifetimes CSV (``lifetime_s`` column, optional
            ``preempted``; or the GCE GPU lifetime spreadsheet export), fitted as ``empirical``.

    Raises:
        UnknownNameError: unknown model name or server type.
        DataNotFoundError: the path does not exist.
        DataFormatError: the file cannot be parsed.
    """
    path = Path(spec).expanduser()
    if spec.endswith((".json", ".csv")) or path.exists():
        if not path.exists():
            raise DataNotFoundError(f"lifetime model file not found: {path}")
        if path.suffix.lower() == ".json":
            try:
                return model_from_dict(json.loads(path.read_text()))
            except json.JSONDecodeError as err:
                raise DataFormatError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
        from cmdare.measure.importers.lifetimes import read_lifetimes_file

        obs = read_lifetimes_file(path).rows.get("lifetime_observations", [])
        if not obs:
            raise DataFormatError(f"{path}: no lifetimes found")
        model = EmpiricalLifetime().fit([o["lifetime_s"] for o in obs], [not o["preempted"] for o in obs])
        model.meta = {"source": str(path), "n": len(obs)}
        return model
    name, _, key = spec.partition(":")
    if name not in LIFETIME_MODELS:
        raise UnknownNameError("lifetime model", name, LIFETIME_MODELS)
    fitted = load_defaults().get(name, {})
    key = key.lower() or DEFAULT_KEY
    if key not in fitted:
        raise UnknownNameError(f"server type for lifetime model {name!r}", key, sorted(fitted))
    return model_from_dict(fitted[key])
