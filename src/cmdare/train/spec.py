"""What a training run is: a frozen, validated :class:`TrainSpec`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.option_values import DEFAULT_BATCH_SIZE
from cmdare.ps.optimizer_config import OptimizerConfig
from cmdare.storage.location import mask_credentials
from cmdare.tasks.statistics import CALIBRATION_SAMPLES

if TYPE_CHECKING:
    from cmdare.tasks import Task

DEFAULT_ROLLBACKS = 3  # --on-diverge rollback
MAX_ROLLBACKS = 100
ASYNC_MOMENTUM = ("compensate", "keep")  # --async-momentum

_RATE_UNITS = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30,
               "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
_RATE_UNITS.update(k=1e3, m=1e6, g=1e9, kbits=1e3 / 8, mbits=1e6 / 8, gbits=1e9 / 8)  # short and plural forms


def parse_rate_bytes_per_s(text: str) -> float:
    """A data rate such as ``200MB/s``, ``1.5Gbit/s``, ``10Gbps`` or ``5e8`` (bytes/s) in bytes/s."""
    t = text.strip().lower().replace(" ", "").removesuffix("/s")
    if t.endswith("bps"):  # 10Gbps: bits per second
        t = t[:-3] + "bit"
    i = len(t)
    while i and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    unit = t[i:] or "b"
    try:
        value = float(t[:i]) * _RATE_UNITS[unit]
    except (KeyError, ValueError):
        raise UserInputError(f"--ps-bandwidth: cannot read {text!r}; use e.g. 200MB/s, 1.6Gbit/s or 10Gbps") from None
    if value <= 0:
        raise UserInputError(f"--ps-bandwidth must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class TrainSpec:
    """A training run's configuration. Defaults are the README's main job.

    ``steps`` is the target global step (pushes applied, as in CM-DARE's asynchronous mode).

    ``model``, ``dataset``, ``loss`` and ``metric`` may be your own code (:mod:`cmdare.tasks`): a model factory,
    a map-style dataset, a ``DataLoader`` or a factory of them, a loss function and a metric function, as
    objects (Ray takes them to the workers) or as import paths (``mypkg.models:build_net``, imported on each
    worker).
    """

    model: str | Callable[..., Any] = "resnet15"
    dataset: str | Any = "digits"
    loss: str | Callable[..., Any] | None = None  # default: cross-entropy
    metric: str | Callable[..., Any] | None = None  # default: accuracy on a built-in dataset, none on yours
    data_dir: str | None = None
    workers: int = 2
    ps: int = 1
    steps: int = 500
    batch_size: int = DEFAULT_BATCH_SIZE
    precision: str = "fp32"  # or "amp-bf16": the forward pass in bfloat16 (cmdare.train.workers.precision)
    sync: bool = False
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=0.05, weight_decay=1e-4))
    placement: str = "round-robin"
    checkpoint_every: int = 200  # steps; 0 disables checkpoints (CLI default 50 with --ps-transient)
    eval_every: int = 100  # steps; 0 evaluates only at the end
    seed: int = 0
    chunk_steps: int = 10  # steps a worker runs per call before reporting back
    chunk_s: float = 0.5  # ... or this many seconds, whichever comes first
    # Asynchronous workers: chunks queued on each worker, so it starts the next the moment one ends instead of
    # waiting for the coordinator to read the result and send more (1: one at a time; synchronous runs: 1).
    chunks_ahead: int = 2
    gpus_per_worker: float | str = "auto"  # Ray num_gpus per worker; "auto": 1 when the cluster has GPUs, else 0
    cpus_per_worker: float = 1.0
    cpus_per_shard: float = 1.0
    image_size: int | None = None
    channels: int | None = None
    keep_checkpoints: int = 3
    # Where checkpoints and the run's control files go: a directory or an fsspec URL (s3://, gs://, ...);
    # None: CMDARE_STORAGE, else the data directory (see cmdare.storage).
    storage: str | None = None
    # Servers (CM-DARE: workers on GPU servers, each shard on an on-demand CPU server). Locally they are
    # emulated: prices come from the catalog, revocations from ``revocations`` (see cmdare.control.revocation).
    transient: bool = False
    # Parameter servers on transient servers too: injected revocations hit them, each after a notice
    # (``notice=`` in ``revocations``) in which the shard's blocks are evacuated (cmdare.control.ps_servers).
    ps_transient: bool = False
    gpu: str = "k80"
    # Mixed GPU types, the plan's syntax ("k80:2,v100:1": slots 0-1 K80, slot 2 V100; counts sum to workers);
    # None: every worker is a `gpu`.
    worker_gpus: str | None = None
    cloud: str = "gcp"
    region: str | None = None
    revocations: str | None = None  # e.g. "lifetime=bathtub,speedup=7200", "every=5", "none"
    replace: str = "same"  # same | cheapest | none
    startup: str = "model"  # emulated replacement start-up: "model" (CM-DARE data, compressed) or seconds
    # On a joined cluster: how long a replacement may wait for the autoscaler's node before the replacement
    # policy falls back (cheapest: another GPU type) or gives the slot up; the survivors train meanwhile.
    replacement_timeout_s: float = 600.0
    # Standby servers, each with a worker process that imported torch, read the data and built the model but
    # trains nothing: a replacement takes one (detection + a parameter pull instead of a cold start) and a
    # new standby starts in its place (cmdare.train.workers.warm_pool). Billed like any server, idle or not.
    warm_spares: int = 0
    lr_policy: str = "unchanged"  # on membership change: unchanged | linear | sqrt | staleness
    # Parameter-server load distribution (PSLD): live block moves, elastic shards, straggler injection.
    elastic_ps: bool = False  # let the balancer add and remove shards
    balance_every: int = 50  # steps between balancing decisions
    straggler: str | None = None  # "SHARD:FACTOR", e.g. "0:3" makes shard 0 three times slower
    auto_mitigate: bool = False  # act on detected bottlenecks (add a shard, unload a straggler)
    # Emulated network link of every PS server, e.g. "1Gbit/s": each push and its reply take
    # bytes / bandwidth on the shard (one transfer at a time), so local runs can be PS-bound like cloud PSs.
    ps_bandwidth: str | None = None
    # Send each piece of a gradient to its shard as soon as backward has produced it (with an emulated link,
    # or through Ray to a shard of >= 4 MiB); on a channel an asynchronous shard applies it and sends its
    # parameters back at once, so communication overlaps backward (cmdare.train.workers.overlap); False pushes after
    # backward.
    overlap: bool = True
    # A non-finite loss: "stop" ends the run (failed); "rollback" (3 times) or "rollback:N" rolls every shard
    # back to the newest stored checkpoint, multiplies the learning rate by rollback_lr_scale and trains on.
    on_diverge: str = "stop"
    rollback_lr_scale: float = 0.5
    # Batch-norm statistics of what the run evaluates, checkpoints and exports: recomputed by the chief for the
    # parameters of that step from this many training samples (cmdare.tasks.statistics); 0 keeps the chief's own.
    bn_samples: int = CALIBRATION_SAMPLES
    # Asynchronous workers add momentum of their own (about 1 - 1/workers): "compensate" applies the optimizer's
    # momentum reduced by it on the shards (cmdare.ps.optimizer_config.async_momentum); "keep" applies it as given.
    async_momentum: str = "compensate"
    # How the workers combine their gradients: "ps" (parameter servers, CM-DARE's) or "allreduce" (every worker
    # holds the whole model and optimizer; an elastic group re-formed on every change of members:
    # cmdare.train.allreduce, docs/allreduce.md).
    topology: str = "ps"
    # The optimizer: "sgd" (momentum, weight decay, Nesterov), "adamw", or a torch.optim class by import path
    # (module:Class): the shards run it on their blocks (cmdare.ps.shard_optimizer), all-reduce members on the model.
    optimizer_name: str = "sgd"
    # Clip the gradient to this L2 norm before each update (None: no clipping). All-reduce: the group's averaged
    # gradient (torch.nn.utils.clip_grad_norm_); a PS: each worker's own gradient before its push (an asynchronous
    # push is an update of its own), which sends it after backward.
    clip_grad_norm: float | None = None

    def __post_init__(self) -> None:
        from cmdare.datasets import list_datasets
        from cmdare.tasks import check_part
        from cmdare.workloads.import_path import is_import_path
        from cmdare.workloads.registry import check_model_name

        if isinstance(self.model, str) and not self.model.startswith("<"):
            check_model_name(self.model)
        else:
            check_part(self.model, "--model")
        if isinstance(self.dataset, str) and self.dataset not in list_datasets() and not is_import_path(self.dataset):
            if self.dataset.startswith("<"):
                check_part(self.dataset, "--dataset")
            raise UnknownNameError("dataset", str(self.dataset), list_datasets())
        for option, part in (("--loss", self.loss), ("--metric", self.metric)):
            if part is not None:
                check_part(part, option)
        for name, value in vars(self).items():
            if isinstance(value, float) and math.isnan(value):
                raise UserInputError(f"--{name.replace('_', '-')} must be a number, got nan")
        for name in ("workers", "ps", "steps", "batch_size", "chunk_steps", "chunks_ahead"):
            if getattr(self, name) < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("checkpoint_every", "eval_every", "seed", "bn_samples"):
            if getattr(self, name) < 0:
                raise UserInputError(f"--{name.replace('_', '-')} must not be negative")
        if self.gpus_per_worker != "auto" and (isinstance(self.gpus_per_worker, str | bool)
                                              or not self.gpus_per_worker >= 0):
            raise UserInputError(f"--gpus-per-worker must be 'auto' or a number >= 0, got {self.gpus_per_worker!r}")
        if self.cpus_per_worker < 0 or self.cpus_per_shard < 0:
            raise UserInputError("resource requests must not be negative")
        if self.worker_gpus is not None and sum(self._gpu_counts().values()) != self.workers:
            raise UserInputError(f"--workers {self.worker_gpus} names {sum(self._gpu_counts().values())} workers, "
                                 f"not {self.workers}")
        if self.storage is not None and not self.storage.strip():
            raise UserInputError("--storage must name a directory or a URL such as s3://bucket/prefix")
        if self.chunk_s <= 0:
            raise UserInputError("chunk_s must be positive")
        if not self.replacement_timeout_s > 0:
            raise UserInputError(f"--replacement-timeout must be positive seconds, got {self.replacement_timeout_s}")
        if isinstance(self.warm_spares, bool) or not isinstance(self.warm_spares, int) or self.warm_spares < 0:
            raise UserInputError(f"--warm-spares must be a whole number >= 0, got {self.warm_spares!r}")
        if self.warm_spares and self.replace == "none":
            raise UserInputError("--warm-spares needs replacements: a spare stands in for a lost worker, and "
                                 "--replace none replaces none")
        if self.balance_every < 1:
            raise UserInputError("--balance-every must be at least 1")
        if self.straggler is not None:
            self.straggler_factor()  # validates
        if self.ps_bandwidth is not None:
            parse_rate_bytes_per_s(self.ps_bandwidth)  # validates
        self.max_rollbacks()  # validates
        from cmdare.train.workers.precision import check_precision

        check_precision(self.precision)
        if self.async_momentum not in ASYNC_MOMENTUM:
            raise UnknownNameError("--async-momentum", str(self.async_momentum), ASYNC_MOMENTUM)
        if not 0 < self.rollback_lr_scale <= 1:
            raise UserInputError(f"--rollback-lr-scale must be in (0, 1], got {self.rollback_lr_scale}")
        self._check_topology()
        if self.clip_grad_norm is not None:
            if isinstance(self.clip_grad_norm, bool) or not self.clip_grad_norm > 0 or \
                    not math.isfinite(self.clip_grad_norm):
                raise UserInputError(f"--clip-grad-norm must be a positive number, got {self.clip_grad_norm!r}")
            if self.precision == "amp-fp16" and self.topology != "allreduce":
                raise UserInputError("--clip-grad-norm with --precision amp-fp16 is not built for a PS run: the loss "
                                     "scale is undone on the pushed gradient, after the norm would be taken (with "
                                     "--topology allreduce it is undone first)")
        if str(self.startup) != "model":
            from cmdare.option_values import check_number

            try:  # a day at most: CM-DARE's start-ups take minutes
                check_number(self.startup, "--startup", 0.0, 86_400.0, "seconds")
            except UserInputError:
                raise UserInputError(f"--startup must be 'model' or seconds from 0 to 86400, got {self.startup!r}") \
                    from None

    @property
    def model_name(self) -> str:
        """The model as the run records it: a zoo name, an import path or ``<python NAME>``."""
        from cmdare.tasks import part_name

        return part_name(self.model)

    def task(self) -> Task:
        """The run's :class:`~cmdare.tasks.Task`: the model, this process's view of the data, the loss, the metric.

        Raises:
            UserInputError: a part that does not import, a factory that raises, an empty dataset.
        """
        from cmdare.tasks import build_task

        return build_task(self.model, self.dataset, loss=self.loss, metric=self.metric, data_dir=self.data_dir,
                          image_size=self.image_size, channels=self.channels, seed=self.seed)

    def _gpu_counts(self) -> dict[str, int]:
        from cmdare.cloud.gpu_counts import parse_gpu_counts

        return parse_gpu_counts(self.worker_gpus or f"{self.gpu}:{self.workers}")

    def slot_gpus(self) -> list[str]:
        """The GPU type of each data slot, in slot order (``k80:2,v100:1`` -> ``[k80, k80, v100]``)."""
        return [gpu for gpu, n in self._gpu_counts().items() for _ in range(n)]

    @classmethod
    def parse_workers(cls, text: str | int) -> tuple[int, str | None]:
        """``--workers``: a count (of ``--gpu``), or a mix like ``k80:2,v100:1`` -> ``(total, normalized mix or
        None)``, read as every command reads it (:func:`cmdare.cloud.gpu_counts.parse_workers`).

        Raises:
            UserInputError: a count below 1, a malformed mix, or a mix naming a type with fewer than 1 worker.
            UnknownNameError: a GPU type the catalog does not know.
        """
        from cmdare.cloud.gpu_counts import parse_workers

        workers = parse_workers(text)
        return workers.total, workers.mix_text

    def straggler_factor(self) -> tuple[int, float] | None:
        """``(shard, factor)`` from ``straggler`` ("0:3"), or None."""
        if not self.straggler:
            return None
        shard, _, factor = self.straggler.partition(":")
        try:
            k, f = int(shard), float(factor)
        except ValueError:
            raise UserInputError(f"--straggler must be SHARD:FACTOR (e.g. 0:3), got {self.straggler!r}") from None
        if not 0 <= k < self.ps or f < 1:
            raise UserInputError(f"--straggler: shard must be in [0, {self.ps}) and factor >= 1, "
                                 f"got {self.straggler!r}")
        return k, f

    def max_rollbacks(self) -> int:
        """How often a diverged run rolls back (``on_diverge``: stop 0, rollback 3, rollback:N N)."""
        mode, _, count = self.on_diverge.strip().lower().partition(":")
        if mode == "stop" and not count:
            return 0
        if mode == "rollback" and (not count or count.isdigit() and 1 <= int(count) <= MAX_ROLLBACKS):
            return int(count) if count else DEFAULT_ROLLBACKS
        raise UserInputError(f"--on-diverge must be stop, rollback or rollback:N (N from 1 to {MAX_ROLLBACKS}), "
                             f"got {self.on_diverge!r}")

    def _check_topology(self) -> None:
        """The topology and optimizer exist, and no option of the other topology is set."""
        from cmdare.option_values import check_topology
        from cmdare.workloads.import_path import is_import_path

        check_topology(self.topology)
        if self.optimizer_name not in ("sgd", "adamw") and not is_import_path(self.optimizer_name):
            raise UserInputError(f"--optimizer must be sgd, adamw or a torch.optim class's import path "
                                 f"(module:Class), got {self.optimizer_name!r}")
        if self.topology == "ps":
            return
        meaningless = [name for name, given in (
            ("--ps", self.ps != 1), ("--ps-transient", self.ps_transient), ("--elastic-ps", self.elastic_ps),
            ("--placement", self.placement != "round-robin"), ("--straggler", self.straggler is not None),
            ("--auto-mitigate", self.auto_mitigate), ("--ps-bandwidth", self.ps_bandwidth is not None)) if given]
        if meaningless:
            raise UserInputError(f"--topology allreduce has no parameter servers: {', '.join(meaningless)} means "
                                 "nothing there; leave it out")
        if self.sync:
            raise UserInputError("--sync: an all-reduce run is synchronous already; leave it out")

    def shard_optimizer(self) -> OptimizerConfig:
        """The optimizer the shards apply: the given one, with its momentum reduced for asynchronous workers
        (SGD with ``async_momentum="compensate"``: see :func:`~cmdare.ps.optimizer_config.async_momentum`; the planned
        number of workers counts)."""
        from cmdare.ps.optimizer_config import async_momentum

        if self.sync or self.topology != "ps" or self.optimizer_name != "sgd" or self.async_momentum != "compensate" \
                or self.workers <= 1:
            return self.optimizer
        momentum = async_momentum(self.optimizer.momentum, self.workers)
        return replace(self.optimizer, momentum=momentum, nesterov=self.optimizer.nesterov and momentum > 0)

    def ps_link_bytes_per_s(self) -> float | None:
        """The emulated PS link bandwidth in bytes/s, or None (no emulation)."""
        return parse_rate_bytes_per_s(self.ps_bandwidth) if self.ps_bandwidth else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able configuration (stored with the run and in checkpoints; a password in ``storage`` is
        masked: it is stored nowhere)."""
        from cmdare.tasks import part_name

        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["optimizer"] = asdict(self.optimizer)
        for name in ("model", "dataset", "loss", "metric"):
            data[name] = None if data[name] is None else part_name(data[name])
        if data.get("storage"):
            data["storage"] = mask_credentials(data["storage"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainSpec:
        data = dict(data)
        opt = data.pop("optimizer", None) or {}
        if "decay_steps" in opt:
            opt["decay_steps"] = tuple(opt["decay_steps"])
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(optimizer=OptimizerConfig(**opt), **known)
