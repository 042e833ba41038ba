"""What the planner simulates: job and cluster specs, the model protocols it needs, and its results.

The simulator depends only on the small protocols below (:class:`SpeedModel`, :class:`LifetimeSampler`,
:class:`StartupSampler`, :class:`PriceBook`), so unit tests drive it with deterministic toy models and
the CLI drives it with adapters over ``cmdare.predict``, ``cmdare.measure`` and ``cmdare.cloud``
(see :mod:`cmdare.plan.adapters`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU
from cmdare.cloud.gpu_counts import parse_workers as read_workers
from cmdare.control import LR_POLICIES, REPLACEMENT_POLICIES
from cmdare.errors import UserInputError
from cmdare.option_values import check_topology

__all__ = [
    "MAX_JOB_DAYS",
    "MAX_PS",
    "MAX_WORKERS",
    "AccuracyPredictor",
    "ClusterSpec",
    "JobSpec",
    "LifetimeSampler",
    "PlanModels",
    "PriceBook",
    "RunResult",
    "SimSummary",
    "SpeedModel",
    "StartupSampler",
    "TimeOfDayLifetimeSampler",
    "WorkerGroup",
    "parse_workers",
]

#: Most parameter-server shards a configuration may have (the recommender explores 1..3).
MAX_PS = 8
#: Most workers a configuration may have (a simulated run's work grows with its workers and its days).
MAX_WORKERS = 1024
#: Longest revocation-free job the simulator runs, in days (beyond it a run's events are unbounded).
MAX_JOB_DAYS = 365.0
#: What to do when a transient worker is revoked: start the same type, start the most cost-efficient
#: type of the cluster, or carry on without it.
#: The server type name used for parameter servers (CPU-only VMs, as in CM-DARE).
PS_SERVER = "cpu"


@runtime_checkable
class SpeedModel(Protocol):
    """Training speed of a live membership."""

    def cluster_steps_per_s(self, gpus: Mapping[str, int], ps: int) -> float:
        """Global steps/s with ``gpus`` workers and ``ps`` shards (``ps=0``: single-server training)."""
        ...

    def worker_steps_per_s(self, gpu: str) -> float:
        """Steps/s of one worker of type ``gpu`` on its own (used to weigh the chief's share)."""
        ...


@runtime_checkable
class LifetimeSampler(Protocol):
    """Lifetimes of transient servers."""

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """``size`` lifetimes in seconds of transient ``server`` servers in ``region``."""
        ...


@runtime_checkable
class TimeOfDayLifetimeSampler(Protocol):
    """Lifetimes that depend on the hour of day a server is launched (an optional extension of
    :class:`LifetimeSampler`: the simulator uses it when the job has a ``start_hour``)."""

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        """Hour-agnostic lifetimes, as :meth:`LifetimeSampler.sample`."""
        ...

    def lifetimes_at(self, u: np.ndarray, server: str, region: str, launch_hour: float) -> np.ndarray:
        """Lifetimes (s) for uniforms ``u`` in [0, 1) of servers launched at ``launch_hour`` (0 <= h < 24):
        the inverse CDF of that hour's model, non-decreasing in ``u`` (common random numbers)."""
        ...


@runtime_checkable
class StartupSampler(Protocol):
    """Delay from requesting a server to it training (provisioning + staging + booting + framework)."""

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        """One startup delay in seconds."""
        ...


@runtime_checkable
class PriceBook(Protocol):
    """Whole-VM prices."""

    def price_per_hour_usd(self, server: str, region: str, transient: bool) -> float:
        """USD per hour of one ``server`` VM (a GPU name, or ``"cpu"`` for a parameter server)."""
        ...


@runtime_checkable
class AccuracyPredictor(Protocol):
    """Predicted final test accuracy of the workload (the third objective beside time and cost)."""

    def final_accuracy(self, workers: int, steps: int, revocations: np.ndarray,
                       topology: str = "ps") -> np.ndarray:
        """Accuracy (a fraction) of a run of ``steps`` global steps that started with ``workers`` workers
        (asynchronous PS workers, or the members of an all-reduce group with ``topology="allreduce"``: a
        step then trains one batch per member), for each run's number of revocations."""
        ...


@dataclass(frozen=True)
class PlanModels:
    """The models one simulation needs, for one workload.

    Attributes:
        speed: cluster and worker speed.
        lifetimes: lifetimes of transient servers.
        startup: replacement startup delays.
        prices: whole-VM prices.
        checkpoint_s: time one checkpoint of the workload takes (saved by the chief).
        source: where the models come from, for reports.
        accuracy: predicted final accuracy, or None when no accuracy model applies.
        evacuation: pause of a spot PS shard's evacuation within its notice, by bytes moved
            (:class:`~cmdare.plan.evacuation.EvacuationModel`; None: PS revocations always roll back to
            the checkpoint, as without notices).
        ps_state_bytes: bytes the PS servers hold in all (parameters and momentum), shared by the shards.
        notice_s: a spot PS server's notice lead (the cloud's: GCE 30 s, AWS 120 s).
        event_steps: while workers train, cloud events take effect at the next multiple of this many global steps,
            as in a local emulated run, whose controller acts at step boundaries (1); 0: at once
            (:mod:`cmdare.plan.emulation`).
    """

    speed: SpeedModel
    lifetimes: LifetimeSampler
    startup: StartupSampler
    prices: PriceBook
    checkpoint_s: float
    source: str = ""
    accuracy: AccuracyPredictor | None = None
    evacuation: Any = None
    ps_state_bytes: float = 0.0
    notice_s: float = 30.0
    event_steps: int = 0


@dataclass(frozen=True)
class JobSpec:
    """A training job: which workload, how many global steps, and how often the chief checkpoints.

    The default checkpoint interval, 1,000 steps, is Tensor2Tensor's ``local_eval_frequency``, which
    CM-DARE's runs used as ``save_checkpoints_steps``.

    ``lr_policy`` (a :data:`cmdare.control.LR_POLICIES` name) is applied on every membership change,
    as in the trainer. ``sync``: synchronous rounds, which the run controller shrinks and grows with the
    membership (the speed model says how fast they go).

    ``start_hour`` is the hour of day (0-23, the lifetime data's clock: US Pacific) at which the job
    starts; with it, every server's lifetime comes from the model of the hour it is requested
    (time-of-day-aware lifetimes). None: hour-agnostic lifetimes.
    """

    workload: str
    total_steps: int
    checkpoint_every_steps: int = 1000
    batch_size: int | None = None
    start_hour: int | None = None
    lr_policy: str = "unchanged"
    sync: bool = False
    precision: str = "fp32"  # fp32 | amp-bf16 | amp-fp16: what the workers train in (the speed model's precision)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr_policy", LR_POLICIES.canonical(self.lr_policy))
        from cmdare.option_values import check_precision

        check_precision(self.precision)
        if self.total_steps <= 0:
            raise UserInputError(f"steps must be positive, got {self.total_steps}")
        if self.checkpoint_every_steps <= 0:
            raise UserInputError(f"checkpoint interval must be positive, got {self.checkpoint_every_steps}")
        if self.batch_size is not None and self.batch_size <= 0:
            raise UserInputError(f"batch size must be positive, got {self.batch_size}")
        if self.start_hour is not None and not (
            isinstance(self.start_hour, int | float) and 0 <= self.start_hour < 24
        ):
            raise UserInputError(f"start hour must be an hour of day 0-23, got {self.start_hour}")


@dataclass(frozen=True)
class WorkerGroup:
    """``count`` workers of one GPU type, region and pricing."""

    gpu: str
    count: int
    transient: bool = True
    region: str = "us-east1"

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise UserInputError(f"a worker group needs at least 1 worker, got {self.gpu}:{self.count}")


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster to rent: worker groups, parameter-server shards and the replacement policy.

    ``ps=0`` means single-server training (one worker, no parameter server), the ICAC 2019 baseline.
    Parameter servers are CPU VMs in ``region``; the coordinator (head) runs on the first of them.
    """

    workers: tuple[WorkerGroup, ...]
    ps: int = 1
    region: str = "us-east1"
    ps_transient: bool = False
    replacement: str = "same"
    #: Seconds a replacement may wait for capacity and start-up before the policy falls back (``cheapest``:
    #: another GPU type) or the run trains on without it, as ``cmdare train --replacement-timeout``; None: forever.
    replacement_timeout_s: float | None = None
    #: Standby servers started and billed beside the workers; a replacement takes one instead of starting cold
    #: (``cmdare train --warm-spares``).
    warm_spares: int = 0
    #: How the workers train together: ``ps`` (through the ``ps`` shards) or ``allreduce`` (no PS: ``ps`` is 0).
    topology: str = "ps"

    def __post_init__(self) -> None:
        if self.replacement_timeout_s is not None and not self.replacement_timeout_s > 0:
            raise UserInputError(f"--replacement-timeout must be positive, got {self.replacement_timeout_s}")
        if not self.workers or self.n_workers == 0:
            raise UserInputError("a cluster needs at least 1 worker")
        if self.ps < 0 or self.ps > MAX_PS:
            raise UserInputError(f"ps must be between 0 and {MAX_PS}, got {self.ps}")
        if self.n_workers > MAX_WORKERS:
            raise UserInputError(f"a cluster has at most {MAX_WORKERS} workers, got {self.n_workers}")
        if not 0 <= self.warm_spares <= MAX_WORKERS:
            raise UserInputError(f"--warm-spares must be between 0 and {MAX_WORKERS}, got {self.warm_spares}")
        if check_topology(self.topology) == "allreduce":
            if self.ps or self.ps_transient:
                raise UserInputError("--topology allreduce has no parameter server: leave out --ps and --ps-transient")
        elif self.ps == 0 and self.n_workers != 1:
            raise UserInputError(f"ps=0 (single-server training) needs 1 worker, got {self.n_workers}")
        object.__setattr__(self, "replacement", REPLACEMENT_POLICIES.canonical(self.replacement))

    @property
    def n_workers(self) -> int:
        """Number of workers."""
        return sum(g.count for g in self.workers)

    @property
    def gpu_counts(self) -> dict[str, int]:
        """Workers per GPU type, in first-seen order."""
        counts: dict[str, int] = {}
        for g in self.workers:
            counts[g.gpu] = counts.get(g.gpu, 0) + g.count
        return counts

    @property
    def any_transient(self) -> bool:
        """Whether any server can be revoked."""
        return self.ps_transient or any(g.transient for g in self.workers)

    def label(self) -> str:
        """Short human-readable name, e.g. ``8xK80 spot + 1 PS @us-east1``."""
        parts = []
        for g in self.workers:
            kind = "spot" if g.transient else "on-demand"
            parts.append(f"{g.count}x{g.gpu.upper()} {kind}")
        ps = "all-reduce" if self.topology == "allreduce" else "no PS" if self.ps == 0 else \
            f"{self.ps} PS" + (" spot" if self.ps_transient else "")
        spares = f" + {self.warm_spares} warm spare{'s' if self.warm_spares > 1 else ''}" if self.warm_spares else ""
        return f"{' + '.join(parts)} + {ps}{spares} @{self.region}"


def parse_workers(text: str | int, transient: bool, region: str, catalog: Any = None,
                  gpu: str = DEFAULT_WORKER_GPU) -> tuple[WorkerGroup, ...]:
    """``--workers`` read as every command reads it (:func:`cmdare.cloud.gpu_counts.parse_workers`) into worker
    groups: a mix such as ``"v100:1,p100:1,k80:2"`` (a bare ``k80`` means one), or a count of ``gpu`` (T4 by
    default; the CLI names it in its output).

    Raises:
        UserInputError: on an empty or malformed mix or a count below 1.
        UnknownNameError: a GPU type ``catalog`` (default: the default catalog) does not know.
    """
    counts = read_workers(text, catalog).counts(gpu)
    return tuple(WorkerGroup(name, count, transient, region) for name, count in counts.items())


@dataclass(frozen=True)
class RunResult:
    """One simulated run. ``finished`` is False when the job could not finish within the horizon."""

    wall_time_s: float
    cost_usd: float
    revocations: int
    replacements: int
    steps_lost: float
    finished: bool = True
    evacuations: int = 0  # spot PS shards evacuated within their notice
    parks: int = 0  # of which the last shard's, parked until its replacement was up (training paused)


def _mean(x: np.ndarray) -> float:
    """The mean, exactly the value when every run gives the same one (``x.mean()`` of 50 equal values came
    out one ulp off here: the sum of the copies rounds before the division)."""
    return float(x[0] + np.mean(x - x[0])) if x.size else math.nan


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


@dataclass(frozen=True)
class SimSummary:
    """Statistics over many seeded runs of one configuration."""

    runs: int
    time_mean_s: float
    time_p50_s: float
    time_p95_s: float
    cost_mean_usd: float
    cost_p50_usd: float
    cost_p95_usd: float
    revocations_mean: float
    replacements_mean: float
    steps_lost_mean: float
    finished_fraction: float
    extra: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_runs(cls, results: Sequence[RunResult]) -> SimSummary:
        """Summarize runs (time and cost statistics over all runs, unfinished ones at their horizon)."""
        t = np.array([r.wall_time_s for r in results], dtype=float)
        c = np.array([r.cost_usd for r in results], dtype=float)
        return cls(
            runs=len(results),
            time_mean_s=_mean(t),
            time_p50_s=_pct(t, 50),
            time_p95_s=_pct(t, 95),
            cost_mean_usd=_mean(c),
            cost_p50_usd=_pct(c, 50),
            cost_p95_usd=_pct(c, 95),
            revocations_mean=float(np.mean([r.revocations for r in results])),
            replacements_mean=float(np.mean([r.replacements for r in results])),
            steps_lost_mean=float(np.mean([r.steps_lost for r in results])),
            finished_fraction=float(np.mean([r.finished for r in results])),
            extra={"evacuations_mean": float(np.mean([r.evacuations for r in results])),
                   "parks_mean": float(np.mean([r.parks for r in results]))},
        )

    def to_dict(self) -> dict[str, float]:
        """Plain JSON-ready dictionary."""
        out = {k: v for k, v in self.__dict__.items() if k != "extra"}
        out.update(self.extra)
        return out
