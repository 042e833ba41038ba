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
    PS revoked      -> training stalls until a new PS is up, then rolls back to the last checkpoint
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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from cmdare.cloud.servers import ServerSpec
from cmdare.control import (
    LifetimeRevocations,
    MembershipEvent,
    MembershipKernel,
    Offer,
    RequestReplacement,
    RevocationSource,
    WorkerInfo,
)
from cmdare.plan.spec import (
    PS_SERVER,
    ClusterSpec,
    JobSpec,
    PlanModels,
    RunResult,
    SimSummary,
    TimeOfDayLifetimeSampler,
)

__all__ = ["Simulator", "simulate", "deterministic_time_s"]

#: Lifetimes pre-drawn per transient slot and run; a slot revoked more often draws more on demand.
_LIFETIMES_PER_SLOT = 3
#: A run that has not finished after this many times its revocation-free duration is stopped.
_HORIZON_FACTOR = 50.0


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
                 revocations: Callable[[], RevocationSource] | None = None):
        self.job, self.cluster, self.models = job, cluster, models
        self.revocations = revocations
        gpus = list(cluster.gpu_counts)
        self._slots: list[_Slot] = []
        for g in cluster.workers:
            self._slots += [_Slot(gpus.index(g.gpu), g.transient, g.region) for _ in range(g.count)]
        self.gpus = gpus
        self.gpu_index = {g: i for i, g in enumerate(gpus)}
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
        self._ps_price_s = (
            models.prices.price_per_hour_usd(PS_SERVER, cluster.region, cluster.ps_transient) / 3600
        )
        self._rates: dict[tuple, float] = {}
        #: Hour of day the job starts when lifetimes depend on it, else None (hour-agnostic draws).
        self.start_hour: float | None = (
            float(job.start_hour)
            if job.start_hour is not None and isinstance(models.lifetimes, TimeOfDayLifetimeSampler)
            else None
        )
        self.base_time_s = self.total_time_at(tuple(cluster.gpu_counts.values()), self._slots[0].gpu)

    def offers(self, lost: ServerSpec) -> tuple[Offer, ...]:
        """The offerings a replacement of ``lost`` may run on (for the kernel's ``cheapest`` policy)."""
        offers = self._offers.get(lost.region)
        if offers is None:
            price = self.models.prices.price_per_hour_usd
            cloud = lost.cloud
            offers = self._offers[lost.region] = tuple(
                Offer(ServerSpec(g, cloud, lost.region, True, price(g, lost.region, True)), self._worker_speed[i])
                for i, g in enumerate(self.gpus)
            )
        return offers

    # ---- speed ---------------------------------------------------------------------------------
    def rate(self, counts: tuple[int, ...], chief_gpu: int) -> float:
        """Effective steps/s of a live membership (``counts`` per GPU type) with all PS up."""
        key = (counts, chief_gpu)
        rate = self._rates.get(key)
        if rate is None:
            if sum(counts) == 0:
                rate = 0.0
            else:
                members = {g: n for g, n in zip(self.gpus, counts, strict=True) if n}
                v = self.models.speed.cluster_steps_per_s(members, self.cluster.ps)
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
        return _Run(self, rng).result()

    def run_traced(self, rng: np.random.Generator) -> tuple[RunResult, list[MembershipEvent]]:
        """One run and its membership timeline (the control kernel's record of joins, losses, chief and
        LR changes), to compare with a real run's (``Trainer.kernel.timeline``)."""
        run = _Run(self, rng)
        return run.result(), run.kernel.timeline

    def run_many(self, runs: int, seed: int) -> list[RunResult]:
        """``runs`` independent seeded runs; run ``i`` is the same whatever ``runs`` is."""
        if not self.cluster.any_transient:
            return [self.run_once(np.random.default_rng(0))] * runs
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
            self.models.accuracy.final_accuracy(self.cluster.n_workers, self.job.total_steps, revocations), float
        )

    def _static_cost_per_s(self) -> float:
        worker = sum(self._slot_price_s[(s.gpu, s.transient, s.region)] for s in self._slots)
        return worker + self.cluster.ps * self._ps_price_s


class _Run:
    """State of one SimPy run: the SimPy executor of the control kernel's membership decisions.

    The kernel (:class:`~cmdare.control.MembershipKernel`, the same object the Ray trainer drives)
    holds the membership, elects the chief, applies the LR policy and picks replacements; this class
    turns its decisions into SimPy timeouts and keeps the run's progress and bill.
    """

    def __init__(self, sim: Simulator, rng: np.random.Generator):
        self.sim, self.rng = sim, rng
        self.env = simpy.Environment()
        self.total = float(sim.job.total_steps)
        self.every = sim.job.checkpoint_every_steps
        self.progress = 0.0
        self.t_last = 0.0
        self.speed = 0.0
        self.gen = 0
        self.cost_usd = 0.0
        self.cost_per_s = 0.0
        self.t_bill = 0.0
        self.revocations = 0
        self.replacements = 0
        self.steps_lost = 0.0
        self.ps_down = 0
        self.done = self.env.event()
        self._tod = sim.start_hour is not None
        self._first: dict[int, float] = {}  # time-of-day runs: initial lifetime per transient slot
        self._lifetimes = self._draw_uniforms() if self._tod else self._draw_lifetimes()
        self._same_type = {i: True for i in range(len(sim._slots))}  # slot still on its original GPU type
        source = sim.revocations() if sim.revocations is not None else LifetimeRevocations(self._draw_life)
        self.kernel = MembershipKernel(sim.cluster.n_workers, replacement=sim.cluster.replacement,
                                       lr_policy=sim.job.lr_policy, revocations=source, offers=sim.offers)
        self._next_id = len(sim._slots)
        env = self.env
        first = [WorkerInfo(i, i, sim._specs[i], 0.0, trained_at=0.0) for i in range(len(sim._slots))]
        for w in first:  # billing order as before the kernel: on-demand, PS, transient (same float sums)
            if not w.server.transient:
                self._bill(self._price_s(w.server))
        self._bill(sim.cluster.ps * sim._ps_price_s)
        for w in first:
            if w.server.transient:
                self._bill(self._price_s(w.server))
        self.kernel.start(first, 0.0)
        for w in first:
            self._schedule_deadline(w.worker_id)
        if sim.cluster.ps_transient:
            for _ in range(sim.cluster.ps):
                env.process(self._parameter_server())
        if source.next_due(0.0) is not None:
            env.process(self._scheduled_revocations())
        horizon = env.timeout(_HORIZON_FACTOR * sim.base_time_s)
        horizon.callbacks.append(self._give_up)
        self._reschedule()

    def _draw_lifetimes(self) -> dict[int, list[float]]:
        """Slot-major lifetimes for every transient slot, one vectorized draw per worker group."""
        out: dict[int, list[float]] = {}
        slot_id = 0
        for group in self.sim.cluster.workers:
            if group.transient:
                draws = self.sim.models.lifetimes.sample(
                    self.rng, group.gpu, group.region, group.count * _LIFETIMES_PER_SLOT
                )
                rows = np.asarray(draws, dtype=float).reshape(group.count, _LIFETIMES_PER_SLOT).tolist()
                for i in range(group.count):
                    out[slot_id + i] = rows[i][::-1]  # pop() from the end
            slot_id += group.count
        return out

    def _draw_uniforms(self) -> dict[int, list[float]]:
        """Time-of-day runs: the same slot-major uniforms as :meth:`_draw_lifetimes`. The first of each
        slot is inverted now, vectorized (the initial servers launch at the start hour), into
        ``self._first``; the others stay uniforms, inverted when the slot's replacement is requested,
        through the model of that hour."""
        out: dict[int, list[float]] = {}
        lifetimes = self.sim.models.lifetimes
        slot_id = 0
        for group in self.sim.cluster.workers:
            if group.transient:
                u = self.rng.random(group.count * _LIFETIMES_PER_SLOT).reshape(group.count, _LIFETIMES_PER_SLOT)
                first = lifetimes.lifetimes_at(u[:, 0], group.gpu, group.region, self.sim.start_hour).tolist()
                rows = u[:, 1:].tolist()
                for i in range(group.count):
                    self._first[slot_id + i] = first[i]
                    out[slot_id + i] = rows[i][::-1]  # pop() from the end
            slot_id += group.count
        return out

    def _hour(self) -> float:
        """Hour of day now (time-of-day runs)."""
        return (self.sim.start_hour + self.env.now / 3600.0) % 24.0

    def _lifetime(self, slot_id: int, gpu: str, region: str, same_type: bool) -> float:
        pool = self._lifetimes.get(slot_id)
        lifetimes = self.sim.models.lifetimes
        if not self._tod:
            if same_type and pool:
                return pool.pop()
            return float(lifetimes.sample(self.rng, gpu, region, 1)[0])
        first = self._first.pop(slot_id, None)  # the slot's initial server
        if first is not None:
            return first
        u = pool.pop() if same_type and pool else float(self.rng.random())
        return float(lifetimes.lifetimes_at(np.array([u]), gpu, region, self._hour())[0])

    def _ps_lifetime(self, region: str) -> float:
        lifetimes = self.sim.models.lifetimes
        if not self._tod:
            return float(lifetimes.sample(self.rng, PS_SERVER, region, 1)[0])
        return float(lifetimes.lifetimes_at(self.rng.random(1), PS_SERVER, region, self._hour())[0])

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _bill(self, delta_per_s: float) -> None:
        now = self.env.now
        self.cost_usd += self.cost_per_s * (now - self.t_bill)
        self.t_bill = now
        self.cost_per_s += delta_per_s

    def _advance(self) -> None:
        now = self.env.now
        self.progress = min(self.total, self.progress + self.speed * (now - self.t_last))
        self.t_last = now

    def _price_s(self, spec: ServerSpec) -> float:
        return self.sim.models.prices.price_per_hour_usd(spec.gpu_type, spec.region, spec.transient) / 3600

    def _draw_life(self, w: WorkerInfo) -> float:
        """A lifetime for the server of ``w`` (the kernel counts it from ``w.ready_at``)."""
        return self._lifetime(w.slot, w.server.gpu_type, w.server.region, self._same_type[w.slot])

    def _reschedule(self) -> None:
        """Recompute the speed for the current membership and schedule the finish at that speed."""
        self.gen += 1
        state = self.kernel.state
        if self.ps_down or not state.workers:
            self.speed = 0.0
            return
        index = self.sim.gpu_index
        counts = [0] * len(self.sim.gpus)
        for w in state.workers:
            counts[index[w.server.gpu_type]] += 1
        chief = state.worker(state.chief) if state.chief is not None else state.workers[0]
        self.speed = self.sim.rate(tuple(counts), index[chief.server.gpu_type])
        remaining = self.total - self.progress
        ev = self.env.timeout(remaining / self.speed)
        gen = self.gen
        ev.callbacks.append(lambda _ev: self._finish(gen))

    def _finish(self, gen: int) -> None:
        if gen == self.gen and not self.done.triggered:
            self.progress = self.total
            self.done.succeed(True)

    def _give_up(self, _ev: simpy.Event) -> None:
        if not self.done.triggered:
            self._advance()
            self.done.succeed(False)

    # ---- the kernel's decisions, executed as SimPy events ---------------------------------------
    def _schedule_deadline(self, worker_id: int) -> None:
        deadline = self.kernel.deadlines.get(worker_id)
        if deadline is not None:
            ev = self.env.timeout(max(0.0, deadline - self.env.now))
            ev.callbacks.append(lambda _ev: self._revoke(worker_id))

    def _scheduled_revocations(self):
        """Periodic and scripted revocation sources: wake at each due time, revoke what is due."""
        source = self.kernel.revocations
        while (at := source.next_due(0.0)) is not None:
            yield self.env.timeout(max(0.0, at - self.env.now))
            for wid in self.kernel.due(self.env.now, 0.0):
                self._revoke(wid)

    def _revoke(self, worker_id: int) -> None:
        """A worker's server is revoked: the kernel decides what follows."""
        lost = self.kernel.state.worker(worker_id)
        if lost is None or self.done.triggered:
            return
        self._advance()
        self.revocations += 1
        self._bill(-self._price_s(lost.server))
        for decision in self.kernel.lose(worker_id, self.env.now):
            if isinstance(decision, RequestReplacement):
                self._request(decision, lost)
        self._reschedule()

    def _request(self, decision: RequestReplacement, lost: WorkerInfo) -> None:
        """Start a replacement server: billed from now, joins after a sampled startup delay."""
        spec = decision.spec
        self._same_type[decision.slot] = self._same_type[decision.slot] and spec.gpu_type == lost.server.gpu_type
        delay = float(self.sim.models.startup.sample(self.rng, spec.gpu_type, True, spec.region))
        self.replacements += 1
        self._bill(self._price_s(spec))
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _ev: self._arrive(decision.slot, spec))

    def _arrive(self, slot: int, spec: ServerSpec) -> None:
        if self.done.triggered:
            return
        self._advance()
        now = self.env.now
        w = WorkerInfo(self._next_id, slot, spec, ready_at=now, trained_at=now)
        self._next_id += 1
        self.kernel.join(w, now)
        self._schedule_deadline(w.worker_id)
        self._reschedule()

    def _parameter_server(self):
        """One transient PS: its loss stalls training, and the new PS restarts from the checkpoint."""
        sim, env = self.sim, self.env
        region = sim.cluster.region
        delay = 0.0
        while True:
            life = self._ps_lifetime(region)
            if delay > 0:
                if life <= delay:  # revoked while starting up: still down
                    yield env.timeout(life)
                else:
                    yield env.timeout(delay)
                    self._advance()
                    self.ps_down -= 1
                    self._reschedule()
                    yield env.timeout(life - delay)
                    self._ps_lost()
            else:
                yield env.timeout(life)
                self._ps_lost()
            self.revocations += 1
            delay = float(sim.models.startup.sample(self.rng, PS_SERVER, True, region))
            self.replacements += 1

    def _ps_lost(self) -> None:
        """A shard is gone: stop, and roll back to the last checkpoint (steps since it are lost)."""
        self._advance()
        kept = math.floor(self.progress / self.every) * self.every
        self.steps_lost += self.progress - kept
        self.progress = float(kept)
        self.ps_down += 1
        self._reschedule()

    def result(self) -> RunResult:
        """Run to completion (or the horizon) and return the run's figures."""
        finished = self.env.run(until=self.done)
        self._bill(0.0)
        return RunResult(
            wall_time_s=float(self.env.now),
            cost_usd=self.cost_usd,
            revocations=self.revocations,
            replacements=self.replacements,
            steps_lost=self.steps_lost,
            finished=bool(finished),
        )


def simulate(
    job: JobSpec, cluster: ClusterSpec, models: PlanModels, runs: int = 100, seed: int = 0
) -> SimSummary:
    """Simulate ``runs`` seeded runs of ``job`` on ``cluster`` and summarize them.

    Raises:
        UserInputError: if ``runs`` is below 1.
    """
    from cmdare.errors import UserInputError

    if runs < 1:
        raise UserInputError(f"runs must be at least 1, got {runs}")
    return Simulator(job, cluster, models).summarize(runs, seed)


def deterministic_time_s(job: JobSpec, cluster: ClusterSpec, models: PlanModels) -> float:
    """Training time with no revocations (the lower bound of every run)."""
    return Simulator(job, cluster, models).base_time_s

