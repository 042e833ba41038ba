"""Survival analysis of spot-server lifetimes from traces (:mod:`cmdare.measure.spot_traces`).

- :func:`kaplan_meier`: the Kaplan-Meier survival curve (``1 - empirical_cdf`` of :mod:`lifetime_models`).
- Right-censored maximum likelihood per candidate: ``exponential`` (:class:`ExponentialLifetime`:
  exposure / events), ``weibull`` (:meth:`SpotLifetime.fit`: Nelder-Mead on log shape and log scale).
- :func:`select_by_heldout`: fit each candidate on the first half of a trace in time, score it on the
  second half (left-truncated spans condition on survival to their age at the split), keep the best
  per held-out event and refit it on the whole trace.
- :func:`heldout_check`: the second half's preemptions against a fitted and an assumed model.

The log-likelihood is ``sum log f(t)`` over preemptions + ``sum log S(t)`` over censored spans
- ``sum log S(entry)`` over left-truncated ones. ``bathtub`` (:class:`BathtubLifetime`) models the 24 h
deadline of GCE preemptible VMs, which spot markets do not have: it is a candidate only when some
lifetime of the trace reaches 23 h (only then could a deadline wall show), and is skipped otherwise.
It is fitted by Kolmogorov-Smirnov distance, not likelihood, and has only a CDF: it is scored with a
central-difference density over +-1 s. A zero density or survival scores ``log(1e-300)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.measure.lifetime_models import (
    DEADLINE_S,
    BathtubLifetime,
    ExponentialLifetime,
    LifetimeModel,
    empirical_cdf,
)
from cmdare.measure.spot_traces import ServerSpans
from cmdare.measure.weibull import SpotLifetime

__all__ = ["CANDIDATES", "FitResult", "fit_model", "fit_weibull", "heldout_check", "kaplan_meier", "log_density",
           "log_likelihood", "log_survival", "select_by_heldout", "spans_log_likelihood"]

CANDIDATES = ("exponential", "weibull", "bathtub")
BATHTUB_MIN_LIFETIME_S = DEADLINE_S - 3600.0  # the bathtub is a candidate only if a lifetime reaches this
_FLOOR = 1e-300
_DT = 1.0  # seconds: half-width of the numeric density of CDF-only models


def kaplan_meier(lifetimes_s: Any, censored: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(t, S)``: distinct lifetimes and the Kaplan-Meier survival just after each."""
    t, f = empirical_cdf(lifetimes_s, censored)
    return t, 1.0 - f


def log_survival(model: LifetimeModel, t_s: Any) -> np.ndarray:
    """``log S(t)`` (closed form for exponential and Weibull, else ``log(1 - cdf)``)."""
    t = np.maximum(np.asarray(t_s, dtype=float), 0.0)
    if isinstance(model, ExponentialLifetime):
        return -t / model.mean_s_
    if isinstance(model, SpotLifetime):
        return -((t / model.scale_s_) ** model.shape_)
    return np.log(np.maximum(1.0 - model.cdf(t), _FLOOR))


def log_density(model: LifetimeModel, t_s: Any) -> np.ndarray:
    """``log f(t)`` (closed form for exponential and Weibull, else a central difference of the CDF)."""
    t = np.maximum(np.asarray(t_s, dtype=float), 0.0)
    if isinstance(model, ExponentialLifetime):
        return -math.log(model.mean_s_) - t / model.mean_s_
    if isinstance(model, SpotLifetime):
        k, lam = model.shape_, model.scale_s_
        z = np.maximum(t, 1e-9) / lam
        return math.log(k / lam) + (k - 1.0) * np.log(z) - z ** k
    lo, hi = np.maximum(t - _DT, 0.0), t + _DT
    return np.log(np.maximum((model.cdf(hi) - model.cdf(lo)) / (hi - lo), _FLOOR))


def log_likelihood(model: LifetimeModel, lifetimes_s: Any, censored: Any = None, entries_s: Any = None) -> float:
    """Right-censored (and left-truncated, given ``entries_s``: ages when observation began) log-likelihood."""
    t = np.asarray(lifetimes_s, dtype=float)
    cens = np.zeros(t.size, bool) if censored is None else np.asarray(censored, bool)
    ll = float(np.sum(log_density(model, t[~cens])) + np.sum(log_survival(model, t[cens])))
    if entries_s is not None:
        entries = np.asarray(entries_s, dtype=float)
        ll -= float(np.sum(log_survival(model, entries[entries > 0])))
    return ll


def spans_log_likelihood(model: LifetimeModel, spans: ServerSpans) -> float:
    """:func:`log_likelihood` of every span (censoring and left truncation from ``spans``)."""
    t, cens = spans.lifetimes()
    return log_likelihood(model, t, cens, spans.entries())


def fit_weibull(lifetimes_s: Any, censored: Any = None) -> SpotLifetime:
    """Right-censored Weibull MLE (:meth:`SpotLifetime.fit`)."""
    return SpotLifetime().fit(lifetimes_s, censored)


def fit_model(name: str, lifetimes_s: Any, censored: Any = None) -> LifetimeModel:
    """Fit candidate ``name`` (:data:`CANDIDATES`) to right-censored lifetimes."""
    if name == "exponential":
        return ExponentialLifetime().fit(lifetimes_s, censored)
    if name == "weibull":
        return fit_weibull(lifetimes_s, censored)
    if name == "bathtub":
        return BathtubLifetime().fit(lifetimes_s, censored)
    raise UnknownNameError("candidate lifetime model", name, CANDIDATES)


@dataclass
class FitResult:
    """The model chosen by held-out likelihood, refitted on the whole trace, and what it rests on.

    ``heldout_loglik``: per candidate, held-out log-likelihood per second-half preemption;
    ``skipped``: candidates not fitted and why; ``first_half_model``: the chosen candidate as fitted
    on the first half (what :func:`heldout_check` tests).
    """

    model: LifetimeModel
    chosen: str
    heldout_loglik: dict[str, float]
    skipped: dict[str, str]
    first_half_model: LifetimeModel
    split_at_s: float
    heldout_preemptions: int
    n_servers: int
    n_preemptions: int
    server_hours: float
    horizon_s: float
    source: str
    fitted_on: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record (the model as :meth:`LifetimeModel.to_dict`)."""
        return {
            "source": self.source, "fitted_on": self.fitted_on, "chosen": self.chosen,
            "model": self.model.to_dict(),
            "heldout_loglik_per_event": {k: float(v) for k, v in self.heldout_loglik.items()},
            "skipped": dict(self.skipped), "split_at_h": self.split_at_s / 3600,
            "heldout_preemptions": self.heldout_preemptions, "servers": self.n_servers,
            "preemptions": self.n_preemptions, "server_hours": self.server_hours,
            "horizon_h": self.horizon_s / 3600,
            "mean_lifetime_h": self.server_hours / self.n_preemptions if self.n_preemptions else None,
            **self.meta,
        }


def _midpoint(spans: ServerSpans, at_s: float | None) -> float:
    return float(at_s) if at_s is not None else (spans.observed_from_s + spans.horizon_s) / 2.0


def select_by_heldout(
    spans: ServerSpans,
    candidates: tuple[str, ...] = CANDIDATES,
    fitted_on: date | str | None = None,
    at_s: float | None = None,
) -> FitResult:
    """Pick the candidate with the highest held-out log-likelihood per event, refitted on the whole trace.

    Args:
        spans: a whole trace (observed from its start: no left-truncated spans).
        candidates: names from :data:`CANDIDATES`.
        fitted_on: the date to record (the caller's clock; nothing here reads it).
        at_s: where to split; default the middle of the observed time.

    Raises:
        UserInputError: truncated spans, or no preemption in one of the halves.
    """
    if np.any(spans.entries() > 0):
        raise UserInputError(f"{spans.source}: fit a whole trace (its spans observed from their start)")
    at = _midpoint(spans, at_s)
    first, second = spans.split(at)
    t1, c1 = first.lifetimes()
    n2 = second.preemptions()
    if c1.all() or n2 == 0:
        raise UserInputError(f"{spans.source}: need preemptions on both sides of {at / 3600:.3g} h to select a "
                             f"model ({int((~c1).sum())} before, {n2} after)")
    t, cens = spans.lifetimes()
    heldout: dict[str, float] = {}
    skipped: dict[str, str] = {}
    firsts: dict[str, LifetimeModel] = {}
    for name in candidates:
        if name == "bathtub" and t.max() < BATHTUB_MIN_LIFETIME_S:
            skipped[name] = (f"no lifetime reaches {BATHTUB_MIN_LIFETIME_S / 3600:g} h (longest "
                             f"{t.max() / 3600:.3g} h): a 24 h deadline cannot show in this trace")
            continue
        firsts[name] = fit_model(name, t1, c1)
        heldout[name] = spans_log_likelihood(firsts[name], second) / n2
    if not heldout:
        raise UserInputError(f"no candidate applies to {spans.source}: {skipped}")
    chosen = max(heldout, key=lambda k: heldout[k])
    model = fit_model(chosen, t, cens)
    when = fitted_on.isoformat() if isinstance(fitted_on, date) else fitted_on
    model.meta = {"source": spans.source, "n": int(t.size), "preemptions": spans.preemptions(),
                  "selected_by": "held-out log-likelihood", **({"fitted_on": when} if when else {})}
    return FitResult(model, chosen, heldout, skipped, firsts[chosen], at, n2, spans.n_servers,
                     spans.preemptions(), spans.server_hours(), spans.horizon_s, spans.source, when)


def _expected_preemptions(model: LifetimeModel, t: np.ndarray, entries: np.ndarray) -> float:
    """Sum over spans of the cumulative hazard over each span's observed interval, ``H(end) - H(entry)``."""
    return float(np.sum(log_survival(model, entries) - log_survival(model, t)))


def heldout_check(
    spans: ServerSpans, model_first_half: LifetimeModel, assumption_model: LifetimeModel, at_s: float | None = None
) -> dict[str, Any]:
    """The second half's observed preemptions per server-hour against two models' expectations.

    Args:
        spans: the whole trace, split at ``at_s`` (default its middle, as :func:`select_by_heldout`).
        model_first_half: a model fitted on the first half (``FitResult.first_half_model``).
        assumption_model: e.g. ``SpotLifetime.from_rate(0.075, 30 * 86400)``.

    Returns:
        observed and expected counts, per server-hour and the Poisson z-score ``(obs - exp) / sqrt(exp)``
        for ``fitted`` and ``assumption``.
    """
    _, second = spans.split(_midpoint(spans, at_s))
    t, _ = second.lifetimes()
    entries = second.entries()
    hours, observed = second.server_hours(), second.preemptions()
    out: dict[str, Any] = {"split_at_h": second.observed_from_s / 3600, "spans": int(t.size), "server_hours": hours,
                           "observed": observed, "observed_per_server_hour": observed / hours}
    for key, model in (("fitted", model_first_half), ("assumption", assumption_model)):
        expected = _expected_preemptions(model, t, entries)
        out[f"{key}_model"] = model.to_dict()
        out[f"{key}_expected"] = expected
        out[f"{key}_per_server_hour"] = expected / hours
        out[f"{key}_z"] = (observed - expected) / math.sqrt(expected) if expected > 0 else math.inf
    return out
