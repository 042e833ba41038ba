"""Adapters from the planner's protocols to cmdare's models (predict, measure, cloud).

The simulator only sees :class:`~cmdare.plan.spec.SpeedModel`, ``LifetimeSampler``,
``StartupSampler`` and ``PriceBook``; :func:`load_plan_models` builds them for one workload from
the fitted performance models, the lifetime models and the server catalog.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cmdare.errors import DataNotFoundError, UnknownNameError
from cmdare.plan.spec import PlanModels

__all__ = ["NoRevocations", "QuantileLifetimes", "load_plan_models", "resolve_workload"]

#: Quantiles kept per server type: sampling is one table lookup per lifetime, so a plan of 50,000
#: runs does not call the model's (slower) inverse-CDF sampler 50,000 times.
_QUANTILES = 1 << 15


class QuantileLifetimes:
    """Lifetimes from ``cmdare.measure`` lifetime models, sampled through a cached quantile table.

    Each server type gets ``model:<type>`` when the model has parameters for that type, else the
    model's default parameters. The table holds the sorted draws of a fixed-seed sample of the model,
    so ``u -> table[u * n]`` is (up to 1/n) the model's inverse CDF, and a uniform ``u`` from the run's
    stream keeps runs deterministic and monotone in ``u`` (common random numbers).

    Args:
        spec: lifetime model spec, e.g. ``"bathtub"``, ``"exponential"``, ``"empirical"`` or a path.
    """

    def __init__(self, spec: str = "bathtub"):
        self.spec = spec
        self._tables: dict[str, np.ndarray] = {}
        self.sources: dict[str, str] = {}

    def _table(self, server: str) -> np.ndarray:
        table = self._tables.get(server)
        if table is None:
            model, source = self._model(server)
            table = np.sort(np.asarray(model.sample(np.random.default_rng(12345), _QUANTILES), dtype=float))
            self._tables[server], self.sources[server] = table, source
        return table

    def _model(self, server: str):
        from cmdare.measure.lifetime_models import load_lifetime_model

        if ":" in self.spec or self.spec.endswith((".json", ".csv")):
            return load_lifetime_model(self.spec), self.spec
        try:
            return load_lifetime_model(f"{self.spec}:{server}"), f"{self.spec}:{server}"
        except UnknownNameError as err:
            if err.kind.startswith("server type"):
                return load_lifetime_model(self.spec), self.spec
            raise
        except DataNotFoundError:  # TEMPORARY: measure's fitted defaults are not shipped yet
            from cmdare.plan._fallback import fallback_lifetime

            return fallback_lifetime(server), "fallback exponential (revoked share by 24 h)"

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """``size`` lifetimes (s) of transient ``server`` VMs (``region`` does not change the model)."""
        table = self._table(server)
        return table[(rng.random(size) * table.size).astype(np.int64)]


class NoRevocations:
    """Transient servers that are never revoked (the deterministic limit)."""

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """Infinite lifetimes."""
        return np.full(size, np.inf)


class _PredictSpeed:
    """Cluster speed from ``cmdare.predict`` for one workload, cached per membership."""

    def __init__(self, workload: str):
        self.workload = workload
        self._cache: dict[tuple, float] = {}

    def cluster_steps_per_s(self, gpus: Mapping[str, int], ps: int) -> float:
        key = (tuple(sorted(gpus.items())), ps)
        v = self._cache.get(key)
        if v is None:
            from cmdare.predict import predict_cluster_steps_per_s

            if ps == 0:
                (gpu,) = gpus
                v = self.worker_steps_per_s(gpu)
            else:
                v = float(predict_cluster_steps_per_s(self.workload, dict(gpus), ps))
            self._cache[key] = v
        return v

    def worker_steps_per_s(self, gpu: str) -> float:
        from cmdare.predict import predict_step_time_s

        return 1.0 / float(predict_step_time_s(self.workload, gpu))


def resolve_workload(name: str):
    """The published workload descriptor for ``name`` (``resnet32`` -> ``Res32``).

    Raises:
        UnknownNameError: listing the known workloads.
    """
    from cmdare.predict.workloads import published_workload

    return published_workload(name)


def _have_predict_models() -> bool:
    try:
        from cmdare.predict import predict_cluster_steps_per_s  # noqa: F401
    except ImportError:
        return False
    return True


def load_plan_models(workload: str, lifetime: str = "bathtub") -> PlanModels:
    """Speed, lifetime, startup and price models for ``workload``.

    Args:
        workload: a published workload name (``resnet32``, ``Res15``, ``shakebig`` ...).
        lifetime: lifetime model spec; ``"none"`` gives transient servers that are never revoked.

    Raises:
        UnknownNameError: unknown workload or lifetime model.
    """
    from cmdare.plan import _fallback

    features = resolve_workload(workload)
    lifetimes = NoRevocations() if lifetime == "none" else QuantileLifetimes(lifetime)
    if _have_predict_models():
        speed = _PredictSpeed(features.name)
        source = "cmdare.predict"
    else:
        speed = _fallback.FallbackSpeed(features.name)
        source = "plan fallback (cmdare.predict missing)"
    return PlanModels(
        speed=speed,
        lifetimes=lifetimes,
        startup=_fallback.FallbackStartup(),
        prices=_fallback.FallbackPrices(),
        checkpoint_s=_fallback.checkpoint_s(features.display_name),
        source=f"{features.name} ({features.source}); speed: {source}",
    )


def known_regions() -> tuple[str, ...]:
    """Regions the price book knows."""
    from cmdare.plan import _fallback

    return _fallback.REGIONS


def known_gpus() -> tuple[str, ...]:
    """GPU types the planner can price and predict."""
    from cmdare.plan import _fallback

    return tuple(g for g in _fallback.PRICES if g != "cpu")

