"""Adapters from the planner's protocols to cmdare's models (predict, measure, cloud).

The simulator only sees :class:`~cmdare.plan.spec.SpeedModel`, ``LifetimeSampler``,
``StartupSampler`` and ``PriceBook``; :func:`load_plan_models` builds them for one workload from
the fitted performance models, the lifetime models and the server catalog.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from cmdare.control.revocation import NOTICE_LEAD_S
from cmdare.errors import UnknownNameError, UserInputError
from cmdare.option_values import DEFAULT_BATCH_SIZE
from cmdare.plan.evacuation import DEFAULT_EVACUATION
from cmdare.plan.spec import PS_SERVER, PlanModels

__all__ = [
    "CatalogPrices",
    "NoRevocations",
    "PredictedAccuracy",
    "QuantileLifetimes",
    "load_plan_models",
    "resolve_workload",
]

#: Quantiles kept per server type: sampling is one table lookup per lifetime, so a plan of 50,000
#: runs does not call the model's (slower) inverse-CDF sampler 50,000 times.
_QUANTILES = 1 << 15
#: A cmdare worker's start on a fresh VM once it has booted: its raylet prestarts the worker process, which imports
#: torch and cmdare (1.0 s measured on an idle core, bench/revocation.py's probe), and the worker actor placed in it
#: reads its data and builds the model (0.25 s). CM-DARE measured TensorFlow's at ~55 s cold (~12 s warm); the
#: planner used that until the worker processes were prestarted (issue 46). CUDA's context creation on a GPU server
#: is not measured here (no GPU): it comes on top.
FRAMEWORK_START_S = 1.25


class QuantileLifetimes:
    """Lifetimes from ``cmdare.measure`` lifetime models, sampled through a cached quantile table.

    Each server type gets ``model:<type>`` when the model has parameters for that type, else the
    model's default parameters. With a launch hour (:meth:`lifetimes_at`), a bare model name also uses
    the shipped time-of-day models (:mod:`cmdare.measure.lifetime_tod`). The table holds the sorted
    draws of a fixed-seed sample of the model, so ``u -> table[u * n]`` is (up to 1/n) the model's
    inverse CDF, and a uniform ``u`` from the run's stream keeps runs deterministic and monotone in
    ``u`` (common random numbers).

    Args:
        spec: lifetime model spec, e.g. ``"bathtub"``, ``"exponential"``, ``"empirical"`` or a path.
    """

    def __init__(self, spec: str = "bathtub"):
        from cmdare.measure.lifetime_models import load_lifetime_model

        self.spec = spec
        self._tables: dict[str, np.ndarray] = {}
        self._tod_tables: dict[str, tuple[int, list[np.ndarray]]] = {}
        self.sources: dict[str, str] = {}
        load_lifetime_model(spec)  # an unknown model name or a bad file fails here, not mid-plan

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

    def describe(self, server: str, region: str) -> str:
        """The model ``server`` VMs draw from, e.g. ``bathtub:k80`` (the same in every cloud and market)."""
        self._table(server)
        return self.sources[server]

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """``size`` lifetimes (s) of transient ``server`` VMs (``region`` does not change the model)."""
        table = self._table(server)
        return table[(rng.random(size) * table.size).astype(np.int64)]

    def _hour_tables(self, server: str) -> tuple[int, list[np.ndarray]]:
        """(bucket width h, one quantile table per launch-hour bucket) of ``server``; buckets without
        their own model share the pooled table, so they sample exactly what :meth:`sample` does."""
        entry = self._tod_tables.get(server)
        if entry is None:
            pooled = self._table(server)
            tod = self._tod_model(server)
            if tod is None:
                entry = (24, [pooled])
            else:
                tables = [
                    np.sort(np.asarray(tod.buckets[b].sample(np.random.default_rng(12345), _QUANTILES), float))
                    if b in tod.buckets else pooled
                    for b in range(tod.n_buckets)
                ]
                entry = (tod.bucket_hours, tables)
                hours = ", ".join(f"{b * tod.bucket_hours:02d}-{(b + 1) * tod.bucket_hours:02d} h"
                                  for b in sorted(tod.buckets))
                self.sources[server] += f" (own models for launches at {hours})" if hours else ""
            self._tod_tables[server] = entry
        return entry

    def _tod_model(self, server: str):
        """The shipped time-of-day model of ``server`` for a bare model name, else None (hour-agnostic)."""
        from cmdare.measure.lifetime_models import LIFETIME_MODELS
        from cmdare.measure.lifetime_tod import load_tod_model

        if self.spec not in LIFETIME_MODELS:  # a file, or a model pinned to one server type
            return None
        try:
            return load_tod_model(f"{self.spec}:{server}")
        except UnknownNameError:
            return None

    def lifetimes_at(self, u: np.ndarray, server: str, region: str, launch_hour: float) -> np.ndarray:
        """Lifetimes (s) for uniforms ``u`` in [0, 1) of ``server`` VMs launched at ``launch_hour``
        (hour of day, US Pacific as in the data): the inverse CDF of that hour's bucket model, or of
        the pooled model where the bucket had too few VMs to fit its own."""
        width, tables = self._hour_tables(server)
        table = tables[int((launch_hour % 24.0) // width)]
        return table[(np.asarray(u, dtype=float) * table.size).astype(np.int64)]


class NoRevocations:
    """Transient servers that are never revoked (the deterministic limit)."""

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """Infinite lifetimes."""
        return np.full(size, np.inf)

    def describe(self, server: str, region: str) -> str:
        """``none``: never revoked."""
        return "none"


class _PredictSpeed:
    """Cluster speed from ``cmdare.predict`` for one workload, cached per membership; both topologies over
    ``link_gbps`` links (the PS model's own network by default)."""

    def __init__(self, workload: str, model_error: bool = False, batch_size: int | None = None,
                 precision: str = "fp32", link_gbps: float | None = None):
        from cmdare.predict import PS_MODEL_LINK_GBPS

        self.workload = workload
        self.model_error = model_error
        self.batch_size = batch_size  # per worker; None: train's default
        self.precision = precision
        self.link_gbps = PS_MODEL_LINK_GBPS if link_gbps is None else float(link_gbps)
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
                v = float(predict_cluster_steps_per_s(self.workload, dict(gpus), ps, batch_size=self.batch_size,
                                                      precision=self.precision, link_gbps=self.link_gbps))
            self._cache[key] = v
        return v

    def allreduce_steps_per_s(self, gpus: Mapping[str, int]) -> float:
        """Group steps/s of all-reduce training with ``gpus`` members (:mod:`cmdare.predict.allreduce_speed`)."""
        key = ("allreduce", tuple(sorted(gpus.items())))
        v = self._cache.get(key)
        if v is None:
            from cmdare.predict.allreduce_speed import allreduce_steps_per_s
            from cmdare.predict.workloads import workload_features

            v = self._cache[key] = allreduce_steps_per_s(workload_features(self.workload), dict(gpus),
                                                         link_gbps=self.link_gbps, batch_size=self.batch_size,
                                                         precision=self.precision)
        return v

    def worker_steps_per_s(self, gpu: str) -> float:
        from cmdare.predict import predict_step_time_s

        return 1.0 / float(predict_step_time_s(self.workload, gpu, batch_size=self.batch_size,
                                               precision=self.precision))

    def speed_factor(self, rng: np.random.Generator, gpus) -> float:
        """One draw of the prediction's error (:func:`cmdare.predict.intervals.speed_factor`); 1.0
        unless built with ``model_error``."""
        if not self.model_error:
            return 1.0
        from cmdare.predict import gpu_tflops
        from cmdare.predict.intervals import speed_factor, step_pool

        unseen = any(step_pool(gpu_tflops(g)) == "step_unseen" for g in gpus)
        return speed_factor(rng, unseen)


class _Startup:
    """Replacement delay: the fitted VM startup phases plus the worker process's start (:data:`FRAMEWORK_START_S`)."""

    def __init__(self):
        from dataclasses import replace

        from cmdare.predict import startup_model

        self.model = replace(startup_model(), framework_s=FRAMEWORK_START_S)
        self._params: dict[tuple[str, bool, str], list[tuple[float, float]]] = {}

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        """One start-up (s): the phases' draws of :meth:`StartupModel.sample` added up, in its order."""
        params = self._params.get((server, transient, region))
        if params is None:
            # The startup data names regions by coast (CM-DARE measured us-east1 and us-west1).
            coast = "west" if "west" in region else "east" if "east" in region else None
            mu, sigma = self.model.phase_params(server, transient, coast)
            params = self._params[(server, transient, region)] = list(zip(mu.tolist(), sigma.tolist(), strict=True))
        # numpy's lognormal(mu, sigma) is exp(mu + sigma * z) of a standard normal z: the same draws, in less time
        z = rng.standard_normal(len(params)).tolist()
        phases = [math.exp(m + s * x) for (m, s), x in zip(params, z, strict=True)]
        if self.model.framework_s > 0:
            phases.append(self.model.framework_s)
        return float(sum(phases))


class CatalogPrices:
    """Whole-VM prices from ``cmdare.cloud.catalog`` for one cloud (``"cpu"`` = a PS server)."""

    def __init__(self, catalog=None, cloud: str = "gcp"):
        from cmdare.cloud.catalog import default_catalog

        self.catalog = catalog if catalog is not None else default_catalog()
        self.cloud = cloud
        self._cache: dict[tuple[str, str, bool], float] = {}

    def price_per_hour_usd(self, server: str, region: str, transient: bool) -> float:
        key = (server, region, transient)
        price = self._cache.get(key)
        if price is None:
            gpu = None if server == PS_SERVER else server
            price = self._cache[key] = float(self.catalog.price_per_hour_usd(gpu, self.cloud, region, transient))
        return price

    def gpus(self) -> list[str]:
        """GPU types with a worker offering in this cloud (lower case)."""
        return sorted({o.gpu.lower() for o in self.catalog.find(cloud=self.cloud, role="worker") if o.gpu})

    def regions(self) -> list[str]:
        """Regions of this cloud."""
        return self.catalog.regions(self.cloud)

    def default_region(self, gpus: Sequence[str] = ()) -> str:
        """The region a plan uses when none is given: the one offering most of ``gpus``, us-east first."""
        regions = self.regions()

        def score(region: str) -> tuple[int, bool, int]:
            offered = sum(self.offered(g, region, False) or self.offered(g, region, True) for g in gpus)
            return offered, region.startswith("us-east"), -regions.index(region)

        return max(regions, key=score)

    def default_gpus(self) -> list[str]:
        """The GPU types a plan considers when none are given: CM-DARE's four where this cloud offers them."""
        offered = self.gpus()
        return [g for g in ("k80", "p100", "v100", "t4") if g in offered] or offered

    def offered(self, server: str, region: str, transient: bool) -> bool:
        """Whether the catalog prices ``server`` in ``region`` with that pricing model."""
        try:
            self.price_per_hour_usd(server, region, transient)
        except UserInputError:  # includes unknown names and servers not offered there
            return False
        return True


class PredictedAccuracy:
    """Final accuracy from :mod:`cmdare.predict.accuracy` (fitted on the published ResNet-32/CIFAR-10
    points unless ``model`` is given), as the planner's ``AccuracyPredictor``.

    Staleness is not known before a PS run: the model uses its proxy, ``workers - 1``. An all-reduce run is
    synchronous: staleness 0, and a step of ``workers`` batches (the model's samples seen are the same for the
    same batches trained). The model has no large-batch data: the accuracy a large global batch loses (without
    a learning-rate warm-up and scaling to match) is not predicted.

    Args:
        batch_size: per-worker batch size (train's default, 32; the published points ran at Tensor2Tensor's 128).
        lr_policy: learning-rate policy on membership change (``unchanged``, ``linear``, ...).
        model: a fitted :class:`~cmdare.predict.accuracy.AccuracyModel` (default: the published one).
    """

    def __init__(self, batch_size: int = DEFAULT_BATCH_SIZE, lr_policy: str = "unchanged", model=None):
        from cmdare.predict.accuracy import accuracy_model, policy_code

        self.batch_size = batch_size
        self.lr_code = policy_code(lr_policy)
        self.model = model if model is not None else accuracy_model()

    def final_accuracy(self, workers: int, steps: int, revocations: np.ndarray,
                       topology: str = "ps") -> np.ndarray:
        revs = np.asarray(revocations, dtype=float).ravel()
        levels, back = np.unique(revs, return_inverse=True)
        synchronous = topology == "allreduce"  # no stale gradient; a step trains every member's batch
        X = np.column_stack([
            np.full(len(levels), float(workers)), np.full(len(levels), 0.0 if synchronous else np.nan),
            np.full(len(levels), float(self.batch_size * (workers if synchronous else 1))),
            np.full(len(levels), float(steps)),
            np.full(len(levels), float(self.lr_code)), levels,
        ])
        return self.model.predict(X)[back]


def resolve_workload(name: str, input_shape: tuple[int, ...] | None = None):
    """The workload descriptor of the network ``name`` names: measured (``t2t_resnet32`` -> ``Res32``), or
    from cmdare's profile (``resnet32``, He's; your model at ``input_shape``; its ``source`` says the prediction
    extrapolates).

    Raises:
        UnknownNameError: listing the known workloads.
    """
    from cmdare.predict.workloads import workload_features

    return workload_features(name, input_shape)


def load_plan_models(
    workload: str, lifetime: str = "auto", catalog: str | None = None, cloud: str = "gcp",
    interruption_rate: str | None = None, model_error: bool = False, input_shape: tuple[int, ...] | None = None,
    batch_size: int | None = None, precision: str = "fp32", link_gbps: float | None = None,
) -> PlanModels:
    """Speed, lifetime, startup and price models for ``workload``.

    Args:
        workload: a published workload name (``resnet32``, ``Res15``, ``shakebig`` ...): the models
            were fitted on its CM-DARE measurements.
        lifetime: ``"auto"``: each server type's catalog offering picks the model of its market (GCE
            preemptible: the fitted bathtub; spot: a preemption trace's fit, else exponential at the rate, see
            :class:`~cmdare.plan.markets.OfferingLifetimes`); else a lifetime model spec for every
            server; ``"none"`` gives transient servers that are never revoked.
        catalog: a catalog override file or shipped name (``"icac2019"`` replays the 2019 prices);
            None for the default catalog (or ``$CMDARE_CATALOG``).
        cloud: the cloud whose prices (and, with ``"auto"``, markets) apply.
        interruption_rate: overrides every spot offering's interruption rate (``"auto"`` only).
        model_error: draw each simulated run's speed from the speed model's calibrated prediction
            interval (:mod:`cmdare.predict.intervals`), so P95 carries model error too.
        input_shape: one sample's shape, for your own model given by import path (default 3,32,32).
        batch_size: per-worker batch size the speed and accuracy models predict at (None: train's default, 32).
        precision: what the workers train in (``fp32``, ``amp-bf16``, ``amp-fp16``): the speed model's step times.
        link_gbps: each server's network, for the PS's and the all-reduce ring's transfers (None: 10 Gbit/s, the
            network CM-DARE's PS runs are taken to have had).

    Raises:
        UnknownNameError: unknown workload, lifetime model or cloud.
        UserInputError: a malformed interruption rate, or one given without ``"auto"``.
    """
    from cmdare.cloud.catalog import load_catalog
    from cmdare.predict import predict_checkpoint_s

    features = resolve_workload(workload, input_shape)
    cloud = str(cloud).strip().lower()  # "AWS" is aws: its prices, markets and notice lead
    prices = CatalogPrices(load_catalog(catalog) if catalog else None, cloud)
    prices.regions()  # fail early on an unknown cloud
    if interruption_rate is not None and lifetime != "auto":
        raise UserInputError(f"--interruption-rate sets the spot markets' model of --lifetime auto, "
                             f"not of {lifetime!r}")
    if lifetime == "auto":
        from cmdare.plan.markets import OfferingLifetimes

        lifetimes = OfferingLifetimes(prices.catalog, prices.cloud, interruption_rate, fitted=QuantileLifetimes)
    else:
        lifetimes = NoRevocations() if lifetime == "none" else QuantileLifetimes(lifetime)
    from cmdare.predict import step_flops

    batch = DEFAULT_BATCH_SIZE if batch_size is None else batch_size  # one batch for the speed and accuracy models
    step_flops(features, batch)  # a batch size the models cannot take fails here, in one line
    checkpoint_s = predict_checkpoint_s(features.checkpoint_mb * 1e6, features.num_tensors, remote=True)
    from cmdare.workloads.import_path import is_import_path

    yours = is_import_path(workload)  # your own model: the CIFAR classifiers' accuracy points say nothing of it
    return PlanModels(
        speed=_PredictSpeed(features, model_error, batch, precision, link_gbps),
        lifetimes=lifetimes,
        startup=_Startup(),
        prices=prices,
        checkpoint_s=checkpoint_s,
        source=(
            f"{features.name} ({features.source}); cmdare.predict speed/checkpoint/startup"
            + ("" if precision == "fp32" else f" (speed at {precision})") + "; "
            f"lifetimes {_lifetime_source(lifetime, interruption_rate)}; "
            f"prices {catalog or 'default catalog'} ({cloud}); "
            + ("no accuracy model (your own model)" if yours else "accuracy: ICAC 2019 ResNet-32/CIFAR-10 points")
        ),
        accuracy=None if yours else PredictedAccuracy(batch),
        evacuation=DEFAULT_EVACUATION,
        ps_state_bytes=features.checkpoint_mb * 1e6,  # the checkpoint holds the values and the momentum
        notice_s=NOTICE_LEAD_S.get(cloud, NOTICE_LEAD_S["gcp"]),
    )


def _lifetime_source(lifetime: str, rate: str | None) -> str:
    if lifetime != "auto":
        return lifetime
    return "per market (auto" + (f", spot interruption rate {rate}" if rate else "") + ")"
