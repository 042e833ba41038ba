"""One simulated run: the SimPy executor of the control kernel's membership decisions.

:class:`~cmdare.plan.simulator.Simulator` holds what every run of a configuration shares (speeds,
prices, the worker slots); a :class:`SimRun` is one seeded run: its SimPy environment, its kernel
(:class:`~cmdare.control.MembershipKernel`, the object the Ray trainer drives too), its progress and
bill. See :mod:`cmdare.plan.simulator` for how time evolves.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import simpy

from cmdare.cloud.servers import ServerSpec
from cmdare.control import (
    Evacuate,
    LifetimeRevocations,
    MembershipKernel,
    PsServerKernel,
    RequestReplacement,
    WorkerInfo,
)
from cmdare.plan.spec import PS_SERVER, RunResult

__all__ = ["HORIZON_FACTOR", "LIFETIMES_PER_SLOT", "SimClock", "SimRun"]

#: Lifetimes pre-drawn per transient slot and run; a slot revoked more often draws more on demand.
LIFETIMES_PER_SLOT = 3
#: The spec a spot PS server has (for the PS kernel; prices are billed per PS count).
PS_SPOT = ServerSpec(None, "gcp", "any", True, 0.0, role="ps")
#: A run that has not finished after this many times its revocation-free duration is stopped.
HORIZON_FACTOR = 50.0


class SimClock:
    """SimPy's simulated seconds behind the kernel's clock protocol (:class:`cmdare.control.Clock`)."""

    def __init__(self, env: simpy.Environment):
        self.env = env

    def now(self) -> float:
        return float(self.env.now)


class SimRun:
    """State of one SimPy run: the SimPy executor of the control kernel's membership decisions.

    The kernel (:class:`~cmdare.control.MembershipKernel`, the same object the Ray trainer drives)
    holds the membership, elects the chief, applies the LR policy and picks replacements; this class
    turns its decisions into SimPy timeouts and keeps the run's progress and bill.
    """

    def __init__(self, sim: Any, rng: np.random.Generator):  # sim: the run's Simulator
        self.sim, self.rng = sim, rng
        self.env = simpy.Environment()
        self.total = float(sim.job.total_steps)
        self.every = sim.job.checkpoint_every_steps
        self.progress = 0.0
        self.t_last = 0.0
        self.speed = 0.0
        # the speed model's own error, one draw per run from its calibrated interval (issue 17);
        # a spawned stream, so the lifetime draws below are those of a run without it
        draw = getattr(sim.models.speed, "speed_factor", None)
        self.speed_factor = float(draw(rng.spawn(1)[0], tuple(sim.gpus))) if draw is not None else 1.0
        self.gen = 0
        self.cost_usd = 0.0
        self.cost_per_s = 0.0
        self.t_bill = 0.0
        self.revocations = 0
        self.replacements = 0
        self.steps_lost = 0.0
        self.ps_down = 0
        self.ps_live = sim.cluster.ps  # shards holding blocks (one fewer while an evacuated one is replaced)
        self.evacuations = 0
        evacuation = sim.models.evacuation
        #: Pause of one shard's evacuation (None: no notices, every PS revocation rolls back).
        self.evacuation_s = (evacuation.pause_s(sim.models.ps_state_bytes / max(1, sim.cluster.ps))
                             if evacuation is not None else None)
        notice = sim.models.notice_s if self.evacuation_s is not None else 0.0
        self.ps_kernel = PsServerKernel(notice_s=notice, replace=sim.cluster.replacement != "none")
        self.done = self.env.event()
        self._tod = sim.start_hour is not None
        self._first: dict[int, float] = {}  # time-of-day runs: initial lifetime per transient slot
        self._lifetimes = self._draw_uniforms() if self._tod else self._draw_lifetimes()
        self._same_type = {i: True for i in range(len(sim._slots))}  # slot still on its original GPU type
        source = sim.revocations() if sim.revocations is not None else LifetimeRevocations(self._draw_life)
        self.kernel = MembershipKernel(sim.cluster.n_workers, replacement=sim.cluster.replacement,
                                       lr_policy=sim.job.lr_policy, revocations=source, offers=sim.offers,
                                       clock=SimClock(self.env))
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
        horizon = env.timeout(HORIZON_FACTOR * sim.base_time_s)
        horizon.callbacks.append(self._give_up)
        self._reschedule()

    def _draw_lifetimes(self) -> dict[int, list[float]]:
        """Slot-major lifetimes for every transient slot, one vectorized draw per worker group."""
        out: dict[int, list[float]] = {}
        slot_id = 0
        for group in self.sim.cluster.workers:
            if group.transient:
                draws = self.sim.models.lifetimes.sample(
                    self.rng, group.gpu, group.region, group.count * LIFETIMES_PER_SLOT
                )
                rows = np.asarray(draws, dtype=float).reshape(group.count, LIFETIMES_PER_SLOT).tolist()
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
                u = self.rng.random(group.count * LIFETIMES_PER_SLOT).reshape(group.count, LIFETIMES_PER_SLOT)
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
        self.speed = self.sim.rate(tuple(counts), index[chief.server.gpu_type], self.ps_live) * self.speed_factor
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
            for wid in self.kernel.due(None, 0.0):
                self._revoke(wid)

    def _revoke(self, worker_id: int) -> None:
        """A worker's server is revoked: the kernel decides what follows."""
        lost = self.kernel.state.worker(worker_id)
        if lost is None or self.done.triggered:
            return
        self._advance()
        self.revocations += 1
        self._bill(-self._price_s(lost.server))
        for decision in self.kernel.lose(worker_id):
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
        """One transient PS: noticed ahead (the PS kernel decides what follows) or lost with its updates."""
        sim, env = self.sim, self.env
        region = sim.cluster.region
        delay = 0.0
        while True:
            life = self._ps_lifetime(region)
            if delay > 0:
                if life <= delay:  # revoked while starting up: still down
                    yield env.timeout(life)
                    self.revocations += 1
                    delay = self._ps_startup(region)
                    continue
                yield env.timeout(delay)
                self._advance()
                self.ps_down -= 1
                self._reschedule()
                life -= delay
            info = self.ps_kernel.add(PS_SPOT, env.now)
            lead = min(self.ps_kernel.notice_s, life)
            yield env.timeout(life - lead)
            self.revocations += 1
            decisions = self.ps_kernel.revoke(info.worker_id, env.now, self.ps_live, deadline=env.now + lead)
            self.ps_kernel.remove(info.worker_id)
            delay = self._ps_startup(region)
            evacuate = next((d for d in decisions if isinstance(d, Evacuate)), None)
            if evacuate is not None and evacuate.onto == "survivors":
                yield from self._pause(self.evacuation_s)
                self.evacuations += 1
                self._set_ps_live(-1)
                yield env.timeout(delay)
                yield from self._pause(self.evacuation_s)  # the replacement is filled
                self._set_ps_live(+1)
                delay = 0.0
            elif evacuate is not None and delay + self.evacuation_s <= lead:
                yield env.timeout(delay)  # the replacement is up within the notice: the blocks move to it
                yield from self._pause(self.evacuation_s)
                self.evacuations += 1
                delay = 0.0
            else:  # no notice, or the replacement comes too late: the shard dies with its updates
                yield env.timeout(lead)
                self._ps_lost()
                delay = max(0.0, delay - lead)
                if delay == 0.0:
                    self._advance()
                    self.ps_down -= 1
                    self._reschedule()

    def _ps_startup(self, region: str) -> float:
        self.replacements += 1
        return float(self.sim.models.startup.sample(self.rng, PS_SERVER, True, region))

    def _pause(self, seconds: float):
        """Training stands still for ``seconds`` (an evacuation at an iteration boundary)."""
        self._advance()
        self.ps_down += 1
        self._reschedule()
        yield self.env.timeout(seconds)
        self._advance()
        self.ps_down -= 1
        self._reschedule()

    def _set_ps_live(self, delta: int) -> None:
        self._advance()
        self.ps_live += delta
        self._reschedule()

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
            evacuations=self.evacuations,
        )
