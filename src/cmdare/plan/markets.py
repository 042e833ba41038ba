"""The planner's lifetimes per market (``--lifetime auto``) and what a plan reports about them.

:class:`OfferingLifetimes` is the ``LifetimeSampler`` that gives each server type the lifetime model of
its catalog offering's market (:mod:`cmdare.measure.lifetime_markets`): GCE preemptible servers draw
exactly what ``--lifetime bathtub`` draws (per-type fits, time-of-day models with ``--start-hour``),
spot servers the model fitted from a preemption trace of the offering, else an exponential (or Weibull) at
its interruption rate, with no deadline; a replacement spot server first waits for capacity as long as the
trace's servers took to come back (:meth:`OfferingLifetimes.capacity_wait`).
:func:`lifetime_labels` names the model each configuration used; :func:`revocation_stats` reads
revocation times and server ages from simulated membership timelines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cmdare.plan.spec import PS_SERVER, ClusterSpec

__all__ = ["OfferingLifetimes", "lifetime_labels", "revocation_stats", "traced_runs"]

_QUANTILES = 1 << 15  # as plan.adapters: one table look-up per lifetime


class OfferingLifetimes:
    """Lifetimes of each server type and region from its catalog offering's market model.

    Args:
        catalog: the server catalog (markets, lifetime models, interruption rates).
        cloud: the cloud whose offerings apply.
        rate: an interruption rate overriding every spot offering's (``"8%/month"``, ``"5-10%"``).
        fitted: builds the sampler of a fitted (preemptible) model from its name, e.g.
            :class:`~cmdare.plan.adapters.QuantileLifetimes`.
    """

    spec = "auto"

    def __init__(self, catalog: Any, cloud: str, rate: str | None = None, *, fitted: Callable[[str], Any]):
        from cmdare.cloud.catalog_model import parse_interruption_rate

        self.catalog, self.cloud, self.rate = catalog, cloud, rate
        if rate is not None:
            parse_interruption_rate(rate)  # a malformed rate fails here, not mid-plan
        self._markets: dict[tuple[str, str], Any] = {}
        self._tables: dict[tuple[str, str], np.ndarray] = {}
        self._fitted: dict[str, Any] = {}  # preemptible model name -> QuantileLifetimes (per-type fits, hours)
        self._make_fitted = fitted

    def market(self, server: str, region: str):
        """The :class:`~cmdare.measure.lifetime_markets.MarketLifetime` of transient ``server`` VMs in ``region``."""
        key = (server.lower(), region)
        ml = self._markets.get(key)
        if ml is None:
            from cmdare.measure.lifetime_markets import market_lifetime

            ml = self._markets[key] = market_lifetime(self.catalog, self.cloud, key[0], region, True, self.rate)
        return ml

    def _quantiles(self, ml):
        """The shared quantile sampler of a fitted (preemptible) model: what ``--lifetime NAME`` samples."""
        name = ml.spec.partition(":")[0]
        if name not in self._fitted:
            self._fitted[name] = self._make_fitted(name)
        return self._fitted[name]

    def _table(self, server: str, region: str, ml) -> np.ndarray:
        key = (server.lower(), region)
        table = self._tables.get(key)
        if table is None:
            draws = ml.model.sample(np.random.default_rng(12345), _QUANTILES) if ml.model is not None else None
            table = np.full(1, np.inf) if draws is None else np.sort(np.asarray(draws, dtype=float))
            self._tables[key] = table
        return table

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """``size`` lifetimes (s) of transient ``server`` VMs in ``region``."""
        ml = self.market(server, region)
        if ml.spec is not None:
            return self._quantiles(ml).sample(rng, server, region, size)
        table = self._table(server, region, ml)
        return table[(rng.random(size) * table.size).astype(np.int64)]

    def lifetimes_at(self, u: np.ndarray, server: str, region: str, launch_hour: float) -> np.ndarray:
        """Lifetimes for uniforms ``u``: through the launch hour's model for a fitted market, else
        hour-agnostic (no time-of-day data exists for spot markets)."""
        ml = self.market(server, region)
        if ml.spec is not None:
            return self._quantiles(ml).lifetimes_at(u, server, region, launch_hour)
        table = self._table(server, region, ml)
        return table[(np.asarray(u, dtype=float) * table.size).astype(np.int64)]

    def capacity_wait(self, rng: np.random.Generator, server: str, region: str) -> float:
        """Seconds a replacement ``server`` VM waits for spot capacity: a draw from the gaps of the trace its
        market's model was fitted on (until the count of servers held recovered); 0 where no trace says."""
        fit = self.market(server, region).fit  # a spot market's trace fit (not with --interruption-rate)
        model = fit.capacity if fit is not None else None
        return 0.0 if model is None else float(model.sample(rng, 1)[0])

    def describe(self, server: str, region: str) -> str:
        """The model of ``server`` VMs in ``region``, e.g. ``exponential 7.5%/month (band 5-10%) (aws spot,
        assumption)``."""
        return self.market(server, region).describe()


def _describe(lifetimes: Any, server: str, region: str) -> str:
    if hasattr(lifetimes, "describe"):
        return str(lifetimes.describe(server, region))
    return str(getattr(lifetimes, "spec", type(lifetimes).__name__))


def lifetime_labels(cluster: ClusterSpec, lifetimes: Any) -> dict[str, str]:
    """The lifetime model of each transient server type of ``cluster`` (``{"k80": "bathtub:k80 (gcp
    preemptible)", "cpu": ...}``); empty when nothing is transient."""
    out: dict[str, str] = {}
    for g in cluster.workers:
        if g.transient and g.gpu not in out:
            out[g.gpu] = _describe(lifetimes, g.gpu, g.region)
    if cluster.ps_transient and cluster.ps:
        out[PS_SERVER] = _describe(lifetimes, PS_SERVER, cluster.region)
    return out


def revocation_stats(runs: Sequence[tuple[Any, Sequence[Any]]]) -> dict[str, Any]:
    """Revocation times and server ages over ``(RunResult, membership timeline)`` pairs.

    Returns:
        ``revocation_times_s`` (the first run's worker revocations, in order), ``revocations_after_24h_mean``
        (per run, revocations later than 24 h into the job), ``server_age_max_h`` (the oldest any
        worker server got, revoked or still running at the end) and ``revoked_lifetime_max_h``.
    """
    after, age_max, life_max, first = [], 0.0, 0.0, None
    for result, timeline in runs:
        joined: dict[int, float] = {}
        losses = []
        for e in timeline:
            if e.kind == "join" and e.worker_id is not None:
                joined[e.worker_id] = e.time
            elif e.kind == "loss" and e.worker_id is not None:
                losses.append(e.time)
                life = e.time - joined.pop(e.worker_id, 0.0)
                life_max, age_max = max(life_max, life), max(age_max, life)
        for t in joined.values():
            age_max = max(age_max, result.wall_time_s - t)
        after.append(sum(t > 24 * 3600.0 for t in losses))
        first = losses if first is None else first
    return {
        "revocation_times_s": [float(t) for t in first or []],
        "revocations_after_24h_mean": float(np.mean(after)) if after else 0.0,
        "server_age_max_h": age_max / 3600,
        "revoked_lifetime_max_h": life_max / 3600,
    }


def traced_runs(sim: Any, runs: int, seed: int) -> list[tuple[Any, list[Any]]]:
    """``(RunResult, membership timeline)`` of each of ``runs`` seeded runs, with the streams of
    :meth:`~cmdare.plan.simulator.Simulator.run_many` (run ``i`` is the same run)."""
    words = np.random.SeedSequence(seed).generate_state(runs, dtype=np.uint64)
    return [sim.run_traced(np.random.Generator(np.random.PCG64(int(w)))) for w in words]
