"""Monte Carlo simulation of a training job on a cluster of transient servers (SimPy).

How time evolves in one run::

    t=0  all initial servers live, training starts (initial VM startup is not counted, as in the
         published runs, which time training only)
         |
         |  progress grows at the effective speed of the live membership; no individual steps are
         |  simulated: the speed only changes at membership events, so a run costs O(#events)
         v
    worker revoked  -> leaves; the control kernel (the trainer's own policy objects) decides:
                       chief: the longest-serving live worker takes the role, no restart;
                       replacement policy: same | cheapest (lowest price per step) | none;
                       LR policy: the new learning-rate scale (recorded in the timeline)
                       replacement requested now, joins after a sampled startup delay
    PS revoked      -> with a notice (spot PS, ``models.evacuation_s`` set), the PS kernel decides: other
                       shards left: training pauses for the evacuation, goes on with one PS fewer
                       until the replacement PS is up (then pauses again to refill it); the last
                       shard: its replacement starts on the notice and takes the blocks if it is up
                       before the deadline; otherwise (or without notice) training stalls until a
                       new PS is up, then rolls back to the last checkpoint
    progress == total steps -> done: wall time, cost, revocations, replacements, steps lost

Checkpoints: every ``N`` steps the chief stops training for ``c`` seconds (the predicted checkpoint
time) while the other workers go on, so a membership with speed ``v``, whose chief alone contributes
a share ``w_chief / W`` of it, advances at ``N / (N / v + c * w_chief / W)`` steps/s.

A server's lifetime runs from the moment it is ready (as in the trainer): a replacement cannot be
revoked while it starts up, but bills from its request.

Billing is per second for every server from its request (a replacement bills its startup) until it
is revoked or the job ends; parameter servers (and the coordinator, which runs on the first of
them) included.

Determinism: run ``i`` of ``simulate(..., seed=s)`` uses its own stream spawned from ``s``, so its
result does not depend on how many runs are asked for. Lifetimes of a worker group are drawn in one
vectorized call per run, slot-major, which gives common random numbers across cluster sizes.

Time of day: with ``job.start_hour`` and a lifetime sampler that has ``lifetimes_at`` (see
:class:`~cmdare.plan.spec.TimeOfDayLifetimeSampler`), a server requested at simulated time ``t`` draws
from the model of hour ``(start_hour + t / 3600) mod 24``: a replacement launched at night draws from
the night model. The same uniforms are drawn, slot-major, as in the hour-agnostic case, and each is
inverted through the model of the hour its server is requested, so common random numbers hold.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cmdare.cloud.servers import ServerSpec
from cmdare.control import (
    MembershipEvent,
    Offer,
    RevocationPlan,
    RevocationSource,
)
from cmdare.control.offers import ReplacementOffers
from cmdare.errors import CmdareError, UserInputError
from cmdare.plan.sim_driver import LIFETIMES_PER_SLOT, SimRun
from cmdare.plan.spec import (
    MAX_JOB_DAYS,
    PS_SERVER,
    ClusterSpec,
    JobSpec,
    PlanModels,
    RunResult,
    SimSummary,
    TimeOfDayLifetimeSampler,
)

__all__ = ["Simulator", "simulate", "deterministic_time_s"]

_LIFETIMES_PER_SLOT = LIFETIMES_PER_SLOT  # the name the benchmarks read


def effective_steps_per_s(v: float, chief_share: float, checkpoint_s: float, every_steps: int) -> float:
    """Speed including the chief's checkpoint pauses (see the module docstring)."""
    if v <= 0:
        return 0.0
    return every_steps / (every_steps / v + checkpoint_s * chief_share)


@dataclass
class _Slot:
    gpu: int
    transient: bool
    region: str


class Simulator:
    """Simulates one configuration many times; speeds are cached per membership across runs.

    Args:
        job: the training job.
        cluster: the configuration.
        models: speed, lifetime, startup and price models for the job's workload.
    """

    def __init__(self, job: JobSpec, cluster: ClusterSpec, models: PlanModels,
                 revocations: Callable[[], RevocationSource] | None = None, plan: RevocationPlan | None = None):
        self.job, self.cluster, self.models = job, cluster, models
        self.revocations = revocations
        #: ``--revocations`` as the trainer reads it: which servers injected revocations hit, a PS notice's lead.
        self.plan = plan or RevocationPlan()
        gpus = list(cluster.gpu_counts)
        self._slots: list[_Slot] = []
        for g in cluster.workers:
            self._slots += [_Slot(gpus.index(g.gpu), g.transient, g.region) for _ in range(g.count)]
        self.gpus = gpus
        self.gpu_index = {g.lower(): i for i, g in enumerate(gpus)}  # names as any source spells them
        self._worker_speed = [models.speed.worker_steps_per_s(g) for g in gpus]
        price = models.prices.price_per_hour_usd
        self._slot_price_s = {
            (s.gpu, s.transient, s.region): price(gpus[s.gpu], s.region, s.transient) / 3600
            for s in self._slots
        }
        cloud = getattr(models.prices, "cloud", "gcp")
        self._specs = [
            ServerSpec(gpus[s.gpu], cloud, s.region, s.transient, price(gpus[s.gpu], s.region, s.transient))
            for s in self._slots
        ]
        #: What a replacement may run on, per region: the cluster's GPU types at spot prices, with their speeds.
        self._offers: dict[str, tuple[Offer, ...]] = {}
        catalog = getattr(models.prices, "catalog", None)
        priced = cluster.replacement in ("cheapest", "cost-efficient")
        self._catalog_offers = (ReplacementOffers(catalog, self._speed_of if priced else None)
                                if catalog is not None else None)
        self._ps_price_s = (
            models.prices.price_per_hour_usd(PS_SERVER, cluster.region, cluster.ps_transient) / 3600
        )
        self._rates: dict[tuple, float] = {}
        self._server_price_s: dict[tuple[str | None, str, bool], float] = {}
        #: Hour of day the job starts when lifetimes depend on it, else None (hour-agnostic draws).
        self.start_hour: float | None = (
            float(job.start_hour)
            if job.start_hour is not None and isinstance(models.lifetimes, TimeOfDayLifetimeSampler)
            else None
        )
        self.base_time_s = self.total_time_at(tuple(cluster.gpu_counts.values()), self._slots[0].gpu)
        #: The job is longer than the simulator runs (:data:`MAX_JOB_DAYS` without revocations).
        self.beyond_horizon = self.base_time_s > MAX_JOB_DAYS * 86400

    def offers(self, lost: ServerSpec) -> Sequence[Offer]:
        """The offerings a replacement of ``lost`` may run on (for the kernel's ``cheapest`` policy): the trainer's
        rule (:class:`~cmdare.control.offers.ReplacementOffers`: every transient offering of the lost server's cloud
        in the catalog, at the workload's speed on each GPU type); a price book without a catalog (a toy's): the
        cluster's types in the lost server's region."""
        if self._catalog_offers is not None:
            return self._catalog_offers(lost)
        offers = self._offers.get(lost.region)
        if offers is None:
            price = self.models.prices.price_per_hour_usd
            cloud = lost.cloud
            offers = self._offers[lost.region] = tuple(
                Offer(ServerSpec(g, cloud, lost.region, True, price(g, lost.region, True)), self._worker_speed[i])
                for i, g in enumerate(self.gpus)
            )
        return offers

    def _speed_of(self, gpu: str) -> float | None:
        """Steps per second a worker of ``gpu`` trains the job at (None: the speed model cannot say)."""
        try:
            return float(self.models.speed.worker_steps_per_s(gpu.lower()))
        except CmdareError:
            return None

    def index_of(self, gpu: str) -> int:
        """The index of GPU type ``gpu`` in the membership counts; a type a replacement brought (``cheapest``
        rents what is cheapest per step) is added."""
        index = self.gpu_index.get(gpu.lower())
        if index is None:
            index = self.gpu_index[gpu.lower()] = len(self.gpus)
            self.gpus.append(gpu)
            self._worker_speed.append(self._speed_of(gpu) or 0.0)
        return index

    # ---- speed ---------------------------------------------------------------------------------
    def price_s(self, spec: ServerSpec) -> float:
        """USD per second of a server of ``spec`` (cached: every replacement asks)."""
        key = (spec.gpu_type, spec.region, spec.transient)
        price = self._server_price_s.get(key)
        if price is None:
            price = self._server_price_s[key] = (
                self.models.prices.price_per_hour_usd(spec.gpu_type, spec.region, spec.transient) / 3600)
        return price

    def rate(self, counts: tuple[int, ...], chief_gpu: int, ps: int | None = None) -> float:
        """Effective steps/s of a live membership (``counts`` per GPU type) with ``ps`` PS up (default all)."""
        ps = self.cluster.ps if ps is None else ps
        counts = counts + (0,) * (len(self.gpus) - len(counts))  # types a replacement brought since
        key = (counts, chief_gpu, ps)
        rate = self._rates.get(key)
        if rate is None:
            if sum(counts) == 0:
                rate = 0.0
            else:
                members = {g: n for g, n in zip(self.gpus, counts, strict=True) if n}
                if self.cluster.topology == "allreduce":
                    # a step is one of the planned group's global batch: a smaller group covers it in more of its
                    # own steps; every member waits for the chief's checkpoint
                    v = self.models.speed.allreduce_steps_per_s(members) * sum(counts) / self.cluster.n_workers
                    share = 1.0
                else:
                    v = self.models.speed.cluster_steps_per_s(members, ps)
                    total_w = sum(n * w for n, w in zip(counts, self._worker_speed, strict=True))
                    share = self._worker_speed[chief_gpu] / total_w
                rate = effective_steps_per_s(
                    v, share, self.models.checkpoint_s, self.job.checkpoint_every_steps
                )
            self._rates[key] = rate
        return rate

    def total_time_at(self, counts: tuple[int, ...], chief_gpu: int) -> float:
        """Revocation-free training time of the whole job with this membership."""
        return self.job.total_steps / self.rate(counts, chief_gpu)

    def lower_bounds(self) -> tuple[float, float]:
        """(time s, cost USD) that no run of this configuration can beat (replacement policy "same").

        Revocations only remove workers, so every membership a run passes through is a
        sub-membership of the initial one: the run takes at least the steps at the fastest
        sub-membership's speed, and pays at least the steps times the cheapest USD per step of any
        sub-membership (replacements also bill while they start, adding cost without speed).
        """
        full = tuple(self.cluster.gpu_counts.values())
        usd_s = [0.0] * len(full)
        for s in self._slots:
            usd_s[s.gpu] += self._slot_price_s[(s.gpu, s.transient, s.region)] / full[s.gpu]
        ps_usd_s = self.cluster.ps * self._ps_price_s
        best_rate, best_usd_per_step = 0.0, math.inf
        for counts in itertools.product(*(range(n + 1) for n in full)):
            cost_s = ps_usd_s + sum(n * p for n, p in zip(counts, usd_s, strict=True))
            for chief, n in enumerate(counts):
                if n:
                    rate = self.rate(counts, chief)
                    best_rate = max(best_rate, rate)
                    best_usd_per_step = min(best_usd_per_step, cost_s / rate)
        steps = self.job.total_steps
        return steps / best_rate, steps * best_usd_per_step

    # ---- runs ----------------------------------------------------------------------------------
    def run_once(self, rng: np.random.Generator) -> RunResult:
        """Simulate one run with its own random stream."""
        if not self.cluster.any_transient:
            # Nothing random can happen: the run is the revocation-free one.
            t = self.base_time_s
            return RunResult(t, self._static_cost_per_s() * t, 0, 0, 0.0, True)
        return self._run(rng).result()

    def run_traced(self, rng: np.random.Generator) -> tuple[RunResult, list[MembershipEvent]]:
        """One run and its membership timeline (the control kernel's record of joins, losses, chief and
        LR changes), to compare with a real run's (``Trainer.kernel.timeline``)."""
        run = self._run(rng)
        return run.result(), run.kernel.timeline

    def _run(self, rng: np.random.Generator) -> SimRun:
        return SimRun(self, rng, self.revocations() if self.revocations is not None else None)

    def run_many(self, runs: int, seed: int) -> list[RunResult]:
        """``runs`` independent seeded runs; run ``i`` is the same whatever ``runs`` is.

        Raises:
            UserInputError: a transient cluster's job is beyond :data:`MAX_JOB_DAYS` without revocations.
        """
        if not self.cluster.any_transient:
            return [self.run_once(np.random.default_rng(0))] * runs
        if self.beyond_horizon:
            raise UserInputError(f"{self.job.total_steps} steps take {self.base_time_s / 86400:.0f} days on "
                                 f"{self.cluster.label()} without revocations: beyond the simulator's {MAX_JOB_DAYS:g} "
                                 "days; plan fewer --steps or more workers")
        # One 64-bit seed word per run from the seed's SeedSequence: word i does not depend on ``runs``.
        words = np.random.SeedSequence(seed).generate_state(runs, dtype=np.uint64)
        return [self.run_once(np.random.Generator(np.random.PCG64(int(w)))) for w in words]

    def summarize(self, runs: int, seed: int) -> SimSummary:
        """Mean, P50 and P95 of time and cost, and mean revocations, over ``runs`` seeded runs; with an
        accuracy model also the predicted accuracy's mean and P5 (``extra``: accuracy_mean, accuracy_p5)."""
        results = self.run_many(runs, seed)
        summary = SimSummary.from_runs(results)
        summary.extra["deterministic_time_s"] = self.base_time_s
        if self.models.accuracy is not None:
            acc = self._accuracy(np.array([r.revocations for r in results], dtype=float))
            summary.extra["accuracy_mean"] = float(acc.mean())
            summary.extra["accuracy_p5"] = float(np.percentile(acc, 5))
        return summary

    def _accuracy(self, revocations: np.ndarray) -> np.ndarray:
        assert self.models.accuracy is not None
        return np.asarray(
            self.models.accuracy.final_accuracy(self.cluster.n_workers, self.job.total_steps, revocations,
                                                self.cluster.topology), float
        )

    def _static_cost_per_s(self) -> float:
        worker = sum(self._slot_price_s[(s.gpu, s.transient, s.region)] for s in self._slots)
        return worker + self.cluster.ps * self._ps_price_s


def simulate(
    job: JobSpec, cluster: ClusterSpec, models: PlanModels, runs: int = 100, seed: int = 0
) -> SimSummary:
    """Simulate ``runs`` seeded runs of ``job`` on ``cluster`` and summarize them.

    Raises:
        UserInputError: if ``runs`` is below 1.
    """
    if runs < 1:
        raise UserInputError(f"runs must be at least 1, got {runs}")
    return Simulator(job, cluster, models).summarize(runs, seed)


def deterministic_time_s(job: JobSpec, cluster: ClusterSpec, models: PlanModels) -> float:
    """Training time with no revocations (the lower bound of every run)."""
    return Simulator(job, cluster, models).base_time_s

