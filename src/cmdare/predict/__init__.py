"""Performance models of training on cloud GPU servers (cmdare.predict).

Public API (fitted on the public CM-DARE data on first use, cached under
``cmdare.paths.models_dir()/predict`` and refitted when the data or the model code changes)::

    step_time_model() -> StepTimeModel                  # X: features.STEP_COLUMNS -> s/step
    cluster_speed_model() -> PSQueueModel               # X: cluster_speed.CLUSTER_COLUMNS -> steps/s
    checkpoint_model(remote=False) -> CheckpointModel   # X: features.CHECKPOINT_COLUMNS -> s
    startup_model() -> StartupModel                     # .sample(rng, gpu, transient, region)
    fit_from_store(db_url=None) -> dict                 # add cmdare's own checkpoints/servers
    predict_step_time_s(workload, gpu, latency_ms=0.3) -> float
    predict_cluster_steps_per_s(workload, gpus, ps=1) -> float
    predict_checkpoint_s(size_bytes, num_tensors=None, remote=False) -> float
    recovery_time_s(...), recovery_time_published_s(...)
    published_workload(name), list_published_workloads(), gpu_tflops(name)

``workload`` is a model name (``cmdare workloads``; ``t2t_resnet32`` is CM-DARE's T2T ResNet-32, whose
measurements trained the models, and ``resnet32`` He's, predicted from its profile), a name of the data
(``Res32``) or a :class:`WorkloadFeatures`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from cmdare.cloud.gpu_counts import parse_gpu_counts
from cmdare.predict.recovery import recovery_time_published_s, recovery_time_s
from cmdare.predict.workloads import WorkloadFeatures, list_published_workloads, published_workload

__all__ = [
    "PS_MODEL_LINK_GBPS",
    "WorkloadFeatures",
    "checkpoint_model",
    "cluster_speed_model",
    "fit_from_store",
    "gpu_tflops",
    "list_published_workloads",
    "predict_checkpoint_s",
    "predict_cluster_steps_per_s",
    "predict_step_time_s",
    "published_workload",
    "recovery_time_published_s",
    "recovery_time_s",
    "startup_model",
    "step_flops",
    "step_time_model",
]


def __getattr__(name: str) -> object:
    if name == "gpu_tflops":  # loaded on first use: cmdare.predict.features imports pandas
        from cmdare.predict.features import gpu_tflops

        return gpu_tflops
    raise AttributeError(f"module 'cmdare.predict' has no attribute {name!r}")


def _cache_dir() -> Path:
    from cmdare.paths import models_dir

    return models_dir() / "predict"


@lru_cache(maxsize=1)
def _fingerprint() -> str:
    from cmdare.predict.persist import data_fingerprint
    from cmdare.public_data import public_data_dir

    root = public_data_dir() / "cmdare"
    files = [
        p
        for sub in ("speed_data", "speed_and_cluster_size", "checkpoint", "startup_time")
        for p in (root / sub).rglob("*.csv")
    ]
    return data_fingerprint(files)


def _provenance(source: str, rows: int) -> dict:
    from cmdare.public_data import public_data_dir

    return {"data_fingerprint": _fingerprint(), "source": source, "rows": rows, "data_dir": str(public_data_dir())}


def _cached(name: str, suffix: str, fit, source: str):
    from cmdare.predict.persist import load_model, save_model

    path = _cache_dir() / f"{name}{suffix}"
    try:
        model = load_model(path, _fingerprint())
    except Exception:  # a corrupt or foreign cache file is refitted, never trusted
        model = None
    if model is None:
        model, rows = fit()
        with contextlib.suppress(OSError):  # read-only home: the in-memory model still answers
            save_model(model, path, _provenance(source, rows))
    return model


def _step_training_data() -> tuple[np.ndarray, np.ndarray]:
    from cmdare.predict.data import load_latency_speed, load_single_gpu_speed
    from cmdare.predict.features import STEP_COLUMNS

    base = load_single_gpu_speed()
    lat = load_latency_speed()
    lat = lat[lat["Latency (ms)"] > 1.0]  # the 0.3 ms rows repeat the 0-latency table
    X = np.vstack([base[list(STEP_COLUMNS)].to_numpy(float), lat[list(STEP_COLUMNS)].to_numpy(float)])
    y = np.concatenate([base["Step Time (s)"].to_numpy(float), lat["Step Time (s)"].to_numpy(float)])
    return X, y


@lru_cache(maxsize=1)
def step_time_model():
    """cmdare's fitted :class:`~cmdare.predict.step_time.StepTimeModel` (all single-GPU data)."""
    from cmdare.predict.step_time import StepTimeModel

    def fit():
        X, y = _step_training_data()
        return StepTimeModel().fit(X, y), len(y)

    return _cached("step_time", ".json", fit, "speed_data/0latency_data.csv + speed_data_supertable.csv")


@lru_cache(maxsize=1)
def cluster_speed_model():
    """cmdare's fitted :class:`~cmdare.predict.cluster_speed.PSQueueModel` (64 cluster configs)."""
    from cmdare.predict.cluster_speed import CLUSTER_COLUMNS, PSQueueModel
    from cmdare.predict.data import load_cluster_speed

    def fit():
        df = load_cluster_speed()
        model = PSQueueModel().fit(df[list(CLUSTER_COLUMNS)].to_numpy(float), df["Speed (steps/sec)"].to_numpy())
        return model, len(df)

    return _cached("cluster_speed", ".json", fit, "speed_and_cluster_size/ (median steady-state steps/s)")


@lru_cache(maxsize=2)
def checkpoint_model(remote: bool = False):
    """cmdare's fitted :class:`~cmdare.predict.checkpoint.CheckpointModel`; ``remote``: save + upload."""
    from cmdare.predict.evaluate import task_data

    def fit():
        from cmdare.predict.checkpoint import CheckpointModel

        X, y, _ = task_data("checkpoint_remote" if remote else "checkpoint_local")
        return CheckpointModel().fit(X, y), len(y)

    name = "checkpoint_remote" if remote else "checkpoint_local"
    return _cached(name, ".json", fit, "checkpoint/whole_data.csv")


@lru_cache(maxsize=1)
def startup_model():
    """Fitted :class:`~cmdare.predict.startup.StartupModel` (CM-DARE startup phases, plus cmdare's
    own server records after :func:`fit_from_store`)."""
    from cmdare.predict.data import load_startup
    from cmdare.predict.startup import StartupModel

    def fit():
        df = load_startup()
        return StartupModel().fit(df), len(df)

    return _cached("startup", ".json", fit, "startup_time/")


def fit_from_store(db_url: str | None = None) -> dict:
    """Refit the checkpoint and startup models on the public data plus cmdare's own measurements
    in the store (see :mod:`cmdare.predict.store_data`), fit the speed corrections of
    :mod:`cmdare.predict.refine` on the store's runs, and cache them; returns the own rows used
    (``checkpoints``, ``servers``, ``runs``), ``speed``: the refinement with its held-out errors, and
    ``skipped``: what was left out and why (``runs``: ``{reason: [run ids]}``, ``servers``: ``{reason: n}``).
    Emulated runs and servers are never used; a run whose model does not load here is skipped, not fatal.

    Raises:
        StoreError: if the store cannot be opened.
    """
    import hashlib

    import pandas as pd

    from cmdare.measure.store.repository import open_store
    from cmdare.predict.checkpoint import CheckpointModel
    from cmdare.predict.data import load_startup
    from cmdare.predict.evaluate import task_data
    from cmdare.predict.features import CHECKPOINT_COLUMNS
    from cmdare.predict.persist import save_model
    from cmdare.predict.refine import fit_speed_refinement, save_refinement, speed_runs, usable_runs
    from cmdare.predict.startup import StartupModel
    from cmdare.predict.store_data import own_checkpoint_rows, startup_rows

    store = open_store(db_url)
    try:
        ckpt = own_checkpoint_rows(store)
        servers, servers_skipped = startup_rows(store)
        runs, runs_skipped = speed_runs(store)
    finally:
        store.close()
    runs, features, unloadable = usable_runs(runs)
    used: dict = {"checkpoints": len(ckpt), "servers": len(servers), "runs": len(runs),
                  "skipped": {"runs": {**runs_skipped, **unloadable}, "servers": servers_skipped}}
    digest = hashlib.sha256(
        pd.util.hash_pandas_object(ckpt).values.tobytes() + pd.util.hash_pandas_object(servers).values.tobytes()
    ).hexdigest()[:12]

    def meta(source: str, rows: int) -> dict:
        return {
            **_provenance(source, rows),
            "base_fingerprint": _fingerprint(),
            "data_fingerprint": f"{_fingerprint()}+store:{digest}",
            "store_rows": {k: used[k] for k in ("checkpoints", "servers", "runs")},
            "store": str(db_url or "default"),
        }

    for remote, target in ((False, "Local duration"), (True, "Duration")):
        X, y, _ = task_data("checkpoint_remote" if remote else "checkpoint_local")
        own = ckpt.dropna(subset=[target])
        X = np.vstack([X, own[list(CHECKPOINT_COLUMNS)].to_numpy(float)])
        y = np.concatenate([y, own[target].to_numpy(float)])
        name = "checkpoint_remote" if remote else "checkpoint_local"
        save_model(
            CheckpointModel().fit(X, y),
            _cache_dir() / f"{name}.json",
            meta("checkpoint/whole_data.csv + store checkpoints", len(y)),
        )
    startup = pd.concat([load_startup(), servers], ignore_index=True)
    save_model(
        StartupModel().fit(startup), _cache_dir() / "startup.json", meta("startup_time/ + store servers", len(startup))
    )
    checkpoint_model.cache_clear()
    startup_model.cache_clear()
    used["speed"] = fit_speed_refinement(runs, speed_with_scales, features=features)
    save_refinement(used["speed"], db_url)
    return used


def _workload(workload: str | WorkloadFeatures) -> WorkloadFeatures:
    from cmdare.predict.workloads import workload_features

    return workload_features(workload)


def step_flops(w: WorkloadFeatures, batch_size: int | None = None) -> float:
    """The step-time model's FLOPs feature of ``w`` at a per-worker ``batch_size`` (None: train's default,
    :data:`~cmdare.option_values.DEFAULT_BATCH_SIZE`). The public data were measured at Tensor2Tensor's batch of
    128 (:data:`~cmdare.predict.op_profile.PROFILE_BATCH`), where the feature is the model's training FLOPs per
    sample; at another batch it is scaled by ``batch / 128``, so the compute term follows the batch while the
    per-step and per-tensor terms (kernel launches, the update, the PS round trip) do not.

    Raises:
        UserInputError: a batch size that is not a positive whole number.
    """
    from cmdare.option_values import DEFAULT_BATCH_SIZE
    from cmdare.predict.op_profile import PROFILE_BATCH

    batch = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
        from cmdare.errors import UserInputError

        raise UserInputError(f"batch size must be a positive whole number, got {batch_size!r}")
    return w.model_flops * int(batch) / PROFILE_BATCH


def predict_step_time_s(
    workload: str | WorkloadFeatures, gpu: str | float, latency_ms: float = 0.3, refined: bool = True,
    batch_size: int | None = None, precision: str = "fp32",
) -> float:
    """Seconds per step of ``workload`` on one GPU (a type name like ``k80`` or its TFLOPS) at a per-worker
    ``batch_size`` (None: train's default, 32; see :func:`step_flops`); ``refined``: apply the correction fitted
    on the user's own runs of that GPU type, if any. ``precision`` other than ``fp32`` (``amp-bf16``,
    ``amp-fp16``) scales the fp32 answer by the cross-generation model's mixed-precision speed-up on that GPU
    (:func:`cmdare.predict.generations.precision_factor`)."""
    w = _workload(workload)
    from cmdare.predict.features import gpu_tflops

    tf = float(gpu) if isinstance(gpu, int | float) else gpu_tflops(gpu)
    if not (np.isfinite(tf) and tf > 0) or not latency_ms >= 0:
        from cmdare.errors import UserInputError

        raise UserInputError(f"need GPU TFLOPS > 0 and latency >= 0 ms, got {gpu!r} and {latency_ms!r}")
    X = np.array([[tf, step_flops(w, batch_size), w.num_params, w.num_tensors, latency_ms]])
    t = float(step_time_model().predict(X)[0])
    if precision != "fp32":
        from cmdare.predict.generations import precision_factor
        from cmdare.predict.op_profile import op_profile_for

        t *= precision_factor(op_profile_for(*X[0, 1:4]), gpu, int(w.num_params), int(w.num_tensors), precision)
    if refined and isinstance(gpu, str):
        from cmdare.predict.refine import step_scale

        t *= step_scale(gpu)
    return t


#: The network per server (Gbit/s) CM-DARE's PS runs are taken to have had: the PS model's service times are
#: fitted there (the paper does not state it; GCE's VMs of its size had about this much).
PS_MODEL_LINK_GBPS = 10.0


def predict_cluster_steps_per_s(
    workload: str | WorkloadFeatures,
    gpus: Sequence[str] | Mapping[str, int] | str,
    ps: int = 1,
    latency_ms: float = 0.3,
    placement: str = "round-robin",
    refined: bool = True,
    batch_size: int | None = None,
    precision: str = "fp32",
    link_gbps: float | None = None,
) -> float:
    """Global steps/s of asynchronous PS training with the given workers (e.g. ``{"k80": 4, "p100": 2}``,
    ``["k80", "k80"]`` or ``"k80:2,p100:1"``) and ``ps`` parameter servers, tensors placed on them by
    ``placement`` (``round-robin``, ``greedy``, ``mxnet``, ``byteps``, or ``psld`` = balanced load), each worker
    at ``batch_size`` (None: train's default) and ``precision`` (see :func:`predict_step_time_s`; the PS traffic
    stays float32); ``refined``: apply the corrections fitted on the user's own runs (:mod:`cmdare.predict.refine`);
    ``link_gbps``: the network per server, the PS's service demand scaled by :data:`PS_MODEL_LINK_GBPS` over it
    (None: the network the model was fitted on)."""
    from cmdare.errors import UserInputError

    if int(ps) < 1:
        raise UserInputError(f"need at least one parameter server, got {ps}")
    if link_gbps is not None and not link_gbps > 0:
        raise UserInputError(f"--link-gbps must be positive, got {link_gbps}")
    link = 1.0 if link_gbps is None else PS_MODEL_LINK_GBPS / link_gbps
    w = _workload(workload)
    counts = parse_gpu_counts(gpus)
    if not refined:
        return speed_with_scales(w, counts, int(ps), placement, latency_ms, demand_scale=link, batch_size=batch_size,
                                 precision=precision)
    from cmdare.predict.refine import demand_scale, step_scale

    return speed_with_scales(w, counts, int(ps), placement, latency_ms, {g: step_scale(g) for g in counts},
                             demand_scale(counts) * link, batch_size=batch_size, precision=precision)


def speed_with_scales(
    w: WorkloadFeatures,
    counts: Mapping[str, int],
    ps: int,
    placement: str = "round-robin",
    latency_ms: float = 0.3,
    step_scales: Mapping[str, float] | None = None,
    demand_scale: float = 1.0,
    batch_size: int | None = None,
    precision: str = "fp32",
) -> float:
    """Cluster steps/s of the public-data models with each GPU type's step time (at ``batch_size``) times
    ``step_scales[gpu]`` and the PS service time times ``demand_scale`` (what a refinement fits). The PS
    traffic of a step is the parameters', whatever the batch."""
    times = [predict_step_time_s(w, g, latency_ms, refined=False, batch_size=batch_size, precision=precision)
             * (step_scales or {}).get(g, 1.0) for g in counts]
    return cluster_speed_model().predict_mixed(
        times, list(counts.values()), w.num_params, w.num_tensors, ps, placement, demand_scale=demand_scale
    )


def predict_checkpoint_s(size_bytes: float, num_tensors: int | None = None, remote: bool = False) -> float:
    """Seconds to write a checkpoint of ``size_bytes`` locally (``remote``: and upload it to a bucket)."""
    from cmdare.errors import UserInputError

    if not size_bytes > 0:
        raise UserInputError(f"checkpoint size must be positive, got {size_bytes}")
    X = np.array([[size_bytes / 1e6, np.nan if num_tensors is None else float(num_tensors)]])
    return float(checkpoint_model(remote).predict(X)[0])
