"""Lifetime models per cloud, market and GPU: which model a transient server's lifetime is drawn from.

The catalog (:mod:`cmdare.cloud.catalog`) names each offering's transient market and lifetime model:

- ``preemptible`` (GCE preemptible VMs, stopped after at most 24 h): the bathtub (or another
  registered model) fitted on the measured 2018-2019 lifetimes, per server type where fitted
  (``bathtub:k80``), else its pooled default; the planner's time-of-day models stay with it;
- ``spot`` (GCE Spot VMs, AWS Spot Instances: no maximum run time): the model fitted from preemption traces
  for the offering's cloud and GPU where there is one (:mod:`cmdare.measure.spot_fits`: the user's own,
  else the bundled traces': AWS V100 and T4, GCP A100), else :class:`SpotLifetime`, an
  exponential (or Weibull, ``lifetime: weibull`` with ``lifetime_shape``) whose probability of an
  interruption within the rate's period equals the offering's ``interruption_rate`` (``"8%/month"``,
  or an AWS band such as ``"5-10%"``, read as its middle); ``rate=`` overrides it
  (``--interruption-rate``). A rate without a measurement behind it is labelled an assumption;
- ``on-demand``: never revoked.

:func:`market_lifetime` answers for one server (cloud, GPU or ``cpu``, region); :func:`market_rows`
lists every market of a catalog with the model in use and what it rests on (``cmdare report
lifetimes``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cmdare.cloud.catalog_model import RATE_BANDS, Catalog, Offering, parse_interruption_rate
from cmdare.errors import UnknownNameError, UserInputError
from cmdare.measure.lifetime_models import DEADLINE_S, LifetimeModel, load_defaults
from cmdare.measure.weibull import SpotLifetime

__all__ = ["ASSUMED_RATES", "PS_SERVER", "MarketLifetime", "SpotLifetime", "market_lifetime", "market_rows",
           "offering_draw", "offering_lifetime", "preemptible_spec"]

PS_SERVER = "cpu"  # the server type name of a CPU-only parameter server
#: The rate a spot offering without one in the catalog is assumed to have (a user-added offering).
ASSUMED_RATES = {"aws": "5-10%", "gcp": "12%/month"}
_ASSUMED = "assumed"  # interruption sources naming an assumption contain this word


@dataclass(frozen=True)
class MarketLifetime:
    """The lifetime model of one server type in one market, and what it rests on.

    Attributes:
        cloud, market, server: where (``server``: GPU type in lower case, or ``cpu`` for a PS).
        model: the ready-to-sample model, None when servers are never revoked (on-demand).
        label: the model as a spec (``bathtub:k80``) or with its rate (``exponential 7.5%/month``).
        basis: the data it was fitted on, or the assumption it rests on, with source and date.
        assumption: True when no measurement of this market stands behind the model.
        spec: for a fitted (preemptible) model, the :func:`~cmdare.measure.lifetime_models.load_lifetime_model`
            spec, which the planner also uses for its time-of-day models; None otherwise.
        fit: for a spot model fitted on a preemption trace, its :class:`~cmdare.measure.spot_fits.SpotFit`.
    """

    cloud: str
    market: str
    server: str
    model: LifetimeModel | None
    label: str
    basis: str
    assumption: bool
    spec: str | None = None
    fit: Any = None  # the SpotFit of a spot market's preemption trace (its capacity gaps too), when it rests on one

    def describe(self) -> str:
        """One line: ``exponential 7.5%/month (aws spot, assumption)``."""
        tag = ", assumption" if self.assumption else ""
        return f"{self.label} ({self.cloud} {self.market}{tag})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the label, market, basis and the model's parameters."""
        out = {"model": self.label, "cloud": self.cloud, "market": self.market, "server": self.server,
               "basis": self.basis, "assumption": self.assumption}
        if self.model is not None:
            out["params"] = self.model.params() if self.model.name != "empirical" else {}
        return out


def preemptible_spec(name: str, server: str) -> str:
    """``name:server`` when the shipped defaults fit ``name`` for that server type, else ``name`` (pooled)."""
    fitted = load_defaults().get(name, {})
    return f"{name}:{server}" if server in fitted else name


def _fitted_basis(spec: str) -> str:
    name, _, key = spec.partition(":")
    meta = load_defaults().get(name, {}).get(key or "default", {}).get("meta", {})
    what = f"{key} servers" if key else "GPU servers pooled"
    sources = ", ".join(meta.get("source", [])) or "shipped defaults"
    return (f"fitted on {meta.get('n', '?')} measured GCE preemptible lifetimes ({what}; {sources}; "
            f"KS {meta.get('ks', float('nan')):.3f}); 24 h deadline")


def _rate_label(fraction: float, period_s: float, text: str) -> str:
    """``7.5%/month (band 5-10%)``, ``8%/month``, ``2%/day``."""
    per = {30 * 86400.0: "month", 7 * 86400.0: "week", 86400.0: "day", 3600.0: "h"}[period_s]
    band = f" (band {text.strip()})" if text.strip().replace(" ", "") in RATE_BANDS else ""
    return f"{fraction * 100:.4g}%/{per}{band}"


def offering_lifetime(off: Offering, server: str, transient: bool = True, rate: str | None = None) -> MarketLifetime:
    """The lifetime model of ``server`` servers (GPU type or ``cpu``) of offering ``off``.

    Args:
        off: the catalog offering (its market, lifetime model and interruption rate).
        server: the server type name (lower case) used to pick a per-type fit.
        transient: False: an on-demand server (never revoked).
        rate: an interruption rate overriding the offering's (spot markets only).

    Raises:
        UserInputError: a malformed ``rate``.
    """
    market = off.market_for(transient)
    if market == "on-demand":
        return MarketLifetime(off.cloud, market, server, None, "none", "on-demand: never revoked", False)
    if market == "preemptible":
        from cmdare.measure.lifetime_models import load_lifetime_model

        spec = preemptible_spec(off.lifetime, server)
        return MarketLifetime(off.cloud, market, server, load_lifetime_model(spec), spec, _fitted_basis(spec),
                              False, spec)
    if rate is None and off.gpu:
        from cmdare.measure.spot_fits import fitted_spot_lifetime

        fit = fitted_spot_lifetime(off.cloud, server, off.region)
        if fit is not None:
            return MarketLifetime(off.cloud, market, server, fit.model, f"{fit.model.name} fitted ({fit.key})",
                                  fit.basis(), False, fit=fit)
    text = rate if rate is not None else off.interruption_rate or ASSUMED_RATES.get(off.cloud, "10%/month")
    fraction, period_s = parse_interruption_rate(text)
    shape = off.lifetime_shape if off.lifetime == "weibull" and off.lifetime_shape else 1.0
    model = SpotLifetime.from_rate(fraction, period_s, shape)
    label = f"{model.name} {_rate_label(fraction, period_s, text)}" + (f" shape {shape:g}" if shape != 1.0 else "")
    if rate is not None:
        basis, assumed = f"interruption rate {text} given by the user (--interruption-rate); no deadline", True
    elif off.interruption_rate is None:
        basis = f"assumption: no interruption rate in the catalog, {text} assumed for {off.cloud}; no deadline"
        assumed = True
    else:
        assumed = _ASSUMED in off.interruption_source.lower()
        kind = "assumption" if assumed else "reported"
        basis = (f"{kind}: interruption rate {text}, {off.interruption_source or 'no source'}, "
                 f"{off.interruption_as_of or 'undated'}; no deadline")
    return MarketLifetime(off.cloud, market, server, model, label, basis, assumed)


def market_lifetime(
    catalog: Catalog, cloud: str, server: str, region: str, transient: bool = True, rate: str | None = None
) -> MarketLifetime:
    """The lifetime model of a ``server`` (GPU type or ``cpu``) in ``cloud``/``region`` (see :func:`offering_lifetime`).

    Raises:
        UnknownNameError: unknown cloud, region or GPU, or not offered there.
    """
    key = str(server).strip().lower()
    gpu = None if key == PS_SERVER else key
    return offering_lifetime(catalog.offering(gpu, cloud, region), key, transient, rate)


def offering_draw(
    rng: np.random.Generator, catalog: Catalog | None = None, rate: str | None = None
) -> Callable[[Any], float | None]:
    """A lifetime draw for local emulation (``--revocations lifetime=auto``): each server (an object with
    ``.server``, a :class:`~cmdare.cloud.servers.ServerSpec`) draws from its offering's market model,
    one ``model.sample(rng, 1)`` per server as ``lifetime=NAME`` does; None (never) on-demand."""
    if catalog is None:
        from cmdare.cloud.catalog import default_catalog

        catalog = default_catalog()
    models: dict[tuple[str, str, str], LifetimeModel | None] = {}

    def draw(worker: Any) -> float | None:
        spec = worker.server
        key = (spec.cloud, (spec.gpu_type or PS_SERVER).lower(), spec.region)
        if key not in models:
            models[key] = market_lifetime(catalog, *key, transient=True, rate=rate).model
        model = models[key]
        return None if model is None else float(model.sample(rng, 1)[0])

    return draw


def market_rows(catalog: Catalog, rate: str | None = None) -> list[dict[str, Any]]:
    """One row per (cloud, market, model): the servers and regions it covers, the model's mean
    lifetime and chance of a revocation by 24 h and 30 days, and the data or assumption behind it."""
    groups: dict[tuple, dict[str, Any]] = {}
    for off in catalog.offerings:
        server = (off.gpu or PS_SERVER).lower()
        try:
            ml = offering_lifetime(off, server, transient=True, rate=rate)
        except (UnknownNameError, UserInputError) as err:
            groups[(off.cloud, off.market, str(err))] = {"cloud": off.cloud, "market": off.market, "model": str(err)}
            continue
        row = groups.setdefault((off.cloud, ml.market, ml.label, ml.basis), {
            "cloud": off.cloud, "market": ml.market, "model": ml.label, "servers": [], "regions": set(),
            **_model_stats(ml.model, ml.market), "assumption": ml.assumption, "basis": ml.basis,
        })
        if server not in row["servers"]:
            row["servers"].append(server)
        row["regions"].add(off.region)
    rows = []
    for row in groups.values():
        if "servers" in row:
            row["servers"] = ", ".join(row["servers"])
            row["regions"] = len(row["regions"])
        rows.append(row)
    return sorted(rows, key=lambda r: (r["cloud"], r["market"], str(r.get("servers")), r["model"]))


def _model_stats(model: LifetimeModel | None, market: str) -> dict[str, Any]:
    if model is None:
        return {"mean_lifetime_h": math.inf, "revoked_by_24h": 0.0, "revoked_by_30d": 0.0, "deadline_h": None}
    deadline = DEADLINE_S / 3600 if market == "preemptible" else None
    return {
        "mean_lifetime_h": model.mean_s() / 3600,
        "revoked_by_24h": float(model.cdf(DEADLINE_S - 300.0)),
        "revoked_by_30d": float(model.cdf(30 * 86400.0)),
        "deadline_h": deadline,
    }
