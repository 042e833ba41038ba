"""What a run starts from: its storage, the server specs it rents and its initial (or resumed) parameters."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cmdare.cloud.servers import ServerSpec
from cmdare.control import RevocationPlan
from cmdare.errors import CheckpointError, UserInputError
from cmdare.ps.blocks import ParamInfo, param_infos
from cmdare.ps.placement import get_placement
from cmdare.storage import Storage, as_storage, run_storage
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore, load_checkpoint
from cmdare.train.spec import TrainSpec

__all__ = ["InitialState", "gpus_per_worker", "initial_state", "joined_storage_warning", "preflight",
           "server_specs",
           "training_storage"]

class InitialState(NamedTuple):
    """What a run starts from: the parameter layout, the parameters, momentum, batch-norm buffers and step, and
    the run controller's state saved with the checkpoint resumed from (empty: a fresh run, or a checkpoint
    stored before controllers saved theirs), and what an all-reduce checkpoint adds: the optimizer's other state
    and the group's data position (empty, None: a fresh run, or a parameter server's checkpoint)."""

    infos: list[ParamInfo]
    params: np.ndarray
    momentum: np.ndarray
    buffers: dict[str, np.ndarray]
    step: int
    controller: dict[str, Any]
    optimizer: dict[str, np.ndarray] = {}  # noqa: RUF012 - a NamedTuple's default, never mutated
    data_position: tuple[int, int] | None = None
    optimizer_dropped: str | None = None  # the checkpoint's other optimizer, whose state was not loaded


def training_storage(spec: TrainSpec, run_id: str, checkpoint_dir: str | os.PathLike[str] | Storage | None) -> Storage:
    """Where the run keeps checkpoints and control files: ``checkpoint_dir`` (the run's own location)
    if given, else ``RUN`` under ``spec.storage``, ``CMDARE_STORAGE`` or the data directory. Storage that ends
    with the process (``memory://``) is refused: a checkpoint there protects nothing."""
    storage = as_storage(checkpoint_dir) if checkpoint_dir is not None else run_storage(run_id, spec.storage)
    _check_storage(storage)
    return storage


def _check_storage(storage: Storage) -> None:
    """Refuse storage that ends with the process, and a file where the storage's directory should be."""
    if storage.protocol in _PROCESS_MEMORY:
        raise UserInputError(f"--storage {storage.uri} keeps checkpoints in this process's memory: they would "
                             "vanish with it; give a directory or an object store (s3://, gs://)")
    if storage.path is not None and storage.path.exists() and not storage.path.is_dir():
        raise UserInputError(f"--storage {storage.uri} is a file: give a directory or a URL such as "
                             "s3://bucket/prefix")


#: fsspec protocols whose objects live in the process that wrote them.
_PROCESS_MEMORY = frozenset({"memory"})


def joined_storage_warning(address: str | None, spec: TrainSpec, checkpoint_dir: object) -> str | None:
    """The warning a run joined to a cluster gets when its checkpoints would stay on the head only."""
    if not address or spec.storage or os.environ.get("CMDARE_STORAGE") or checkpoint_dir is not None:
        return None
    return ("checkpoints live on the head node only (its data directory): a lost head loses them; pass "
            "--storage URI (a shared directory, s3://bucket/prefix, gs://bucket/prefix) or set CMDARE_STORAGE")


def initial_state(spec: TrainSpec, run_id: str, storage: Storage, resume_from: Path | None,
                  resuming: bool, resume_step: int | None = None) -> InitialState:
    """Validate names and data on the driver; the parameter layout, parameters, momentum, batch-norm
    buffers and step to start from (fresh, or, when ``resuming``, from the checkpoint of ``resume_step``,
    by default the latest: :meth:`CheckpointStore.resume_point`).

    Raises:
        CheckpointError: nothing to resume, or a checkpoint of another model.
        UserInputError: the run is already at ``spec.steps``; unknown names.
    """
    import torch

    task = spec.task()
    task.check(spec.batch_size, spec.workers, spec.seed)  # a batch too big for a slot, or a failing loss, fails here
    _check_optimizer(spec)
    torch.manual_seed(spec.seed)
    model = task.build()
    infos = param_infos((n, p.shape) for n, p in model.named_parameters())
    placement = get_placement(spec.placement).place(infos, spec.ps)
    empty = [k for k in range(spec.ps) if not placement.blocks_on(k)]
    if empty:  # a shard that holds nothing is a server billed for nothing
        raise UserInputError(f"--ps {spec.ps}: {spec.model_name} has {len(placement.blocks)} parameter blocks and "
                             f"placement {spec.placement} leaves {len(empty)} shard(s) empty; use fewer shards")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    momentum = np.zeros_like(params)
    buffers: dict[str, np.ndarray] = {}
    step = 0
    saved: dict[str, Any] = {}
    optimizer: dict[str, np.ndarray] = {}
    position: tuple[int, int] | None = None
    dropped: str | None = None
    if resuming:
        if resume_from is not None:
            where, ckpt = str(resume_from), load_checkpoint(resume_from)
        else:
            store = CheckpointStore(storage)
            if resume_step is None and store.latest() is None:
                raise CheckpointError(f"no checkpoint to resume run {run_id} in {storage.uri}")
            name = store.resume_point(resume_step)
            where, ckpt = storage.url(name), _load_or_say_the_previous(store, name, resume_step)
        if ckpt.params.size != params.size:
            raise CheckpointError(f"checkpoint {where} holds {ckpt.params.size} parameters; model "
                                  f"{spec.model_name} has {params.size}")
        params, momentum, buffers, step = ckpt.params, ckpt.momentum, ckpt.buffers, ckpt.step
        saved = dict((ckpt.meta or {}).get("controller") or {})
        optimizer = dict(ckpt.optimizer)
        trained_with = str(((ckpt.meta or {}).get("spec") or {}).get("optimizer_name", "sgd"))
        if trained_with != spec.optimizer_name:  # its state means nothing to this optimizer: it starts fresh
            optimizer, dropped = {}, trained_with
        where = (ckpt.meta or {}).get("data_position")
        position = (int(where[0]), int(where[1])) if where else None
        if step >= spec.steps:
            raise UserInputError(f"run {run_id} is already at step {step} >= --steps {spec.steps}")
    return InitialState(infos, params, momentum, buffers, step, saved, optimizer, position, dropped)


def _check_optimizer(spec: TrainSpec) -> None:
    """``--optimizer`` builds, and a parameter shard can hold its state (a mistake fails here, in one line)."""
    import torch

    from cmdare.ps.shard_optimizer import shard_optimizer
    from cmdare.ps.torch_optimizer import build_optimizer

    if spec.topology == "ps":
        shard_optimizer(spec.optimizer_name, spec.shard_optimizer())
    else:
        build_optimizer(spec.optimizer_name, [torch.zeros(1, requires_grad=True)], spec.optimizer)


def preflight(spec: TrainSpec) -> tuple[RevocationPlan, list[ServerSpec], ServerSpec]:
    """Check every name and file a run needs that nothing heavy (torch, Ray) is needed to check: revocations,
    policies, placement, server types and regions, the CIFAR-10 directory. A mistake fails in one line, at
    once. Returns the revocation plan and the server specs (:func:`server_specs`).

    Raises:
        UserInputError: an unknown name, a bad option or a missing data file.
    """
    from cmdare.control import LR_POLICIES, REPLACEMENT_POLICIES

    plan = RevocationPlan.parse(spec.revocations, seed=spec.seed)
    REPLACEMENT_POLICIES.canonical(spec.replace)
    LR_POLICIES.canonical(spec.lr_policy)
    get_placement(spec.placement)
    if spec.storage:
        _check_storage(as_storage(spec.storage))
    if spec.dataset == "cifar10":
        from cmdare.datasets.builtin import cifar10_dir

        cifar10_dir(Path(spec.data_dir).expanduser() if spec.data_dir else None)
    return (plan, *server_specs(spec))


def server_specs(spec: TrainSpec) -> tuple[list[ServerSpec], ServerSpec]:
    """Each data slot's worker server spec and the PS server spec, priced from the catalog (a local run
    emulates them). A mixed run (``worker_gpus``) rents each slot a server of its GPU type, in the given
    region or the first region that offers the type."""
    from cmdare.cloud.catalog import default_catalog

    catalog = default_catalog()
    specs: dict[str, ServerSpec] = {}
    for gpu in dict.fromkeys(spec.slot_gpus()):
        region = spec.region
        if region is None:
            offers = catalog.find(gpu=gpu, cloud=spec.cloud)
            if not offers:
                catalog.offering(gpu, spec.cloud, catalog.regions(spec.cloud)[0])  # raises a clear error
            region = sorted(o.region for o in offers)[0]
        specs[gpu] = catalog.server_spec(gpu, spec.cloud, region, spec.transient, role="worker")
    first = next(iter(specs.values()))
    ps = catalog.server_spec(None, spec.cloud, first.region, spec.ps_transient, role="ps")
    return [specs[gpu] for gpu in spec.slot_gpus()], ps


def gpus_per_worker(spec: TrainSpec, joined: bool) -> float:
    """Ray ``num_gpus`` of each worker: as given, or for ``"auto"`` one GPU when the cluster has GPUs, else
    none (the worker trains on the GPU Ray assigns, see :func:`cmdare.train.workers.worker.pick_device`). On this
    machine's own Ray (not ``joined``) with fewer GPUs than workers (warm spares included), the workers share
    them evenly, since no autoscaler adds GPUs."""
    if spec.gpus_per_worker != "auto":
        return float(spec.gpus_per_worker)
    import ray

    total = float(ray.cluster_resources().get("GPU", 0))
    if total <= 0:
        return 0.0
    return 1.0 if joined else min(1.0, total / (spec.workers + spec.warm_spares))


def _load_or_say_the_previous(store: CheckpointStore, name: str, step: int | None) -> Checkpoint:
    """Checkpoint ``name``; when the newest (``step`` None) cannot be loaded, the error names the previous one
    (resuming from it is the user's choice, ``--from-step``)."""
    try:
        return store.load(name)
    except CheckpointError as err:
        newest = store.steps()[-1]
        older = [s for s in store.steps() if s < newest]
        if step is not None or not older:
            raise
        raise CheckpointError(f"{err}; the previous checkpoint is step {older[-1]}: resume from it with "
                              f"--from-step {older[-1]}") from None
