"""Monte Carlo simulation of a training job on a cluster of transient servers (SimPy).

How time evolves in one run::

    t=0  all initial servers live, training starts (initial VM startup is not counted, as in the
         published runs, which time training only)
         |
         |  progress grows at the effective speed of the live membership; no individual steps are
         |  simulated: the speed only changes at membership events, so a run costs O(#events)
         v
    worker revoked  -> leaves; (chief: the next live worker takes the role, no restart)
                       replacement policy: same type | most cost-efficient type | none
                       replacement requested now, joins after a sampled startup delay
    PS revoked      -> training stalls until a new PS is up, then rolls back to the last checkpoint
    progress == total steps -> done: wall time, cost, revocations, replacements, steps lost

Checkpoints: every ``N`` steps the chief stops training for ``c`` seconds (the predicted checkpoint
time) while the other workers go on, so a membership with speed ``v``, whose chief alone contributes
a share ``w_chief / W`` of it, advances at ``N / (N / v + c * w_chief / W)`` steps/s.

A server's lifetime runs from its request, so a replacement can be revoked while it starts up.

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
from dataclasses import dataclass

import numpy as np
import simpy

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

    def __init__(self, job: JobSpec, cluster: ClusterSpec, models: PlanModels):
        self.job, self.cluster, self.models = job, cluster, models
        gpus = list(cluster.gpu_counts)
        self._slots: list[_Slot] = []
        for g in cluster.workers:
            self._slots += [_Slot(gpus.index(g.gpu), g.transient, g.region) for _ in range(g.count)]
        self._replacement_gpu = None
        if cluster.replacement == "cheapest":
            # The most cost-efficient of the cluster's GPU types (spot USD per step).
            def usd_per_step(name: str) -> float:
                price = models.prices.price_per_hour_usd(name, cluster.region, True)
                return price / models.speed.worker_steps_per_s(name)

            self._replacement_gpu = min(gpus, key=usd_per_step)
        self.gpus = gpus
        self._worker_speed = [models.speed.worker_steps_per_s(g) for g in gpus]
        price = models.prices.price_per_hour_usd
        self._price_s = {
            (s.gpu, s.transient, s.region): price(gpus[s.gpu], s.region, s.transient) / 3600
            for s in self._slots
        }
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
            usd_s[s.gpu] += self._price_s[(s.gpu, s.transient, s.region)] / full[s.gpu]
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
        worker = sum(self._price_s[(s.gpu, s.transient, s.region)] for s in self._slots)
        return worker + self.cluster.ps * self._ps_price_s


class _Run:
    """State of one SimPy run; callbacks keep it to a handful of events per membership change."""

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
        self.counts = [0] * len(sim.gpus)
        self.live: dict[int, int] = {}  # slot -> gpu index of joined workers
        self.done = self.env.event()
        self._tod = sim.start_hour is not None
        self._first: dict[int, float] = {}  # time-of-day runs: initial lifetime per transient slot
        self._lifetimes = self._draw_uniforms() if self._tod else self._draw_lifetimes()
        env = self.env
        for slot_id, slot in enumerate(sim._slots):
            self.counts[slot.gpu] += 1
            self.live[slot_id] = slot.gpu
            if slot.transient:
                env.process(self._worker(slot_id, slot))
            else:
                self._bill(sim._price_s[(slot.gpu, False, slot.region)])
        self._bill(sim.cluster.ps * sim._ps_price_s)
        if sim.cluster.ps_transient:
            for _ in range(sim.cluster.ps):
                env.process(self._parameter_server())
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

    def _reschedule(self) -> None:
        """Recompute the speed for the current membership and schedule the finish at that speed."""
        self.gen += 1
        if self.ps_down or not self.live:
            self.speed = 0.0
            return
        chief = self.live[min(self.live)]
        self.speed = self.sim.rate(tuple(self.counts), chief)
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

    def _join(self, slot_id: int, gpu: int) -> None:
        self._advance()
        self.live[slot_id] = gpu
        self.counts[gpu] += 1
        self._reschedule()

    def _leave(self, slot_id: int, gpu: int) -> None:
        self._advance()
        del self.live[slot_id]
        self.counts[gpu] -= 1
        self._reschedule()

    # ---- processes -----------------------------------------------------------------------------
    def _worker(self, slot_id: int, slot: _Slot):
        """One transient worker slot: live, revoked, replaced (after a startup delay), live, ..."""
        sim, env = self.sim, self.env
        gpu, region = slot.gpu, slot.region
        delay = 0.0
        same_type = True
        price = sim._price_s[(gpu, True, region)]
        self._bill(price)
        while True:
            life = self._lifetime(slot_id, sim.gpus[gpu], region, same_type)
            if delay > 0:
                if life <= delay:  # revoked while starting up
                    yield env.timeout(life)
                else:
                    yield env.timeout(delay)
                    self._join(slot_id, gpu)
                    yield env.timeout(life - delay)
                    self._leave(slot_id, gpu)
            else:
                yield env.timeout(life)
                self._leave(slot_id, gpu)
            self.revocations += 1
            self._bill(-price)
            policy = sim.cluster.replacement
            if policy == "none":
                return
            if policy == "cheapest":
                new_gpu = sim.gpus.index(sim._replacement_gpu)
                same_type = same_type and new_gpu == gpu
                gpu = new_gpu
                price = sim.models.prices.price_per_hour_usd(sim.gpus[gpu], region, True) / 3600
            delay = float(sim.models.startup.sample(self.rng, sim.gpus[gpu], True, region))
            self.replacements += 1
            self._bill(price)

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

