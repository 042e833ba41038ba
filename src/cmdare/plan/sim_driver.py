"""One simulated run: the SimPy driver of the run controller.

:class:`~cmdare.plan.simulator.Simulator` holds what every run of a configuration shares (speeds, prices,
the worker slots); a :class:`SimRun` is one seeded run. It drives :class:`~cmdare.control.RunController`,
the very object the Ray trainer drives, in SimPy time: the controller decides (revocations, chief and LR,
replacements and their fallbacks, PS notices, evacuations, parking, restores, the checkpoint schedule);
this driver carries its commands out as SimPy events and keeps the run's progress and bill.

Progress is continuous: the workers the controller keeps training advance the global step at the speed
model's rate for that membership (no steps are simulated, so a run costs O(#events)). Duties are virtual:
a checkpoint is taken and stored the moment its step is passed, and its cost (the chief's stall) is
charged in the speed (see :mod:`cmdare.plan.simulator`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import simpy

from cmdare.cloud.servers import ServerSpec
from cmdare.control import LifetimeRevocations, MembershipKernel, PsServerKernel, RunController
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.dispatch import handler_table
from cmdare.control.kinds import Destination, ShardAction
from cmdare.control.run_config import run_config_for
from cmdare.plan.sim_lifetimes import LIFETIMES_PER_SLOT, SlotLifetimes
from cmdare.plan.spec import PS_SERVER, RunResult

__all__ = ["HORIZON_FACTOR", "LIFETIMES_PER_SLOT", "SimRun"]
#: A run that has not finished after this many times its revocation-free duration is stopped.
HORIZON_FACTOR = 50.0
#: Seconds an all-reduce group takes to re-form and heal its members from a peer. Measured on one machine
#: (``bench/allreduce.py``): 0.1 s from a member's death to the next step; taken 10x longer here for a real
#: network's model transfer and formation across nodes.
REGROUP_S = 1.0


class SimRun:
    """One seeded run: its SimPy environment, its controller, its progress and bill."""

    def __init__(self, sim: Any, rng: np.random.Generator, revocations: Any = None):  # sim: the Simulator
        self.sim, self.rng = sim, rng
        self._handlers = handler_table(self, "_do_", C.Command)  # every kind of command, or it fails here
        self.env = simpy.Environment()
        cluster, job = sim.cluster, sim.job
        self.total = float(job.total_steps)
        self.progress = self.t_last = self.speed = 0.0
        self.fence = math.inf
        # the speed model's own error, one draw per run from its calibrated interval (issue 17);
        # a spawned stream, so the lifetime draws below are those of a run without it
        draw = getattr(sim.models.speed, "speed_factor", None)
        self.speed_factor = float(draw(rng.spawn(1)[0], tuple(sim.gpus))) if draw is not None else 1.0
        self.cost_usd = self.cost_per_s = self.t_bill = 0.0
        self.revoked: set[int] = set()  # worker ids and PS keys revoked (noticed or not)
        self.replacements = 0
        self.steps_lost = 0.0
        self.evacuations = 0
        self.parks = 0
        self.gen = 0
        evacuation = sim.models.evacuation
        #: Pause of one shard's evacuation (None: no notices, every PS revocation rolls back).
        self.evacuation_s = (evacuation.pause_s(sim.models.ps_state_bytes / max(1, cluster.ps))
                             if evacuation is not None else None)
        self.lifetimes = SlotLifetimes(sim, rng, lambda: self.env.now)
        source = revocations if revocations is not None else LifetimeRevocations(self.lifetimes.draw)
        kernel = MembershipKernel(cluster.n_workers, replacement=cluster.replacement, lr_policy=job.lr_policy,
                                  revocations=source, offers=sim.offers)
        plan = sim.plan
        lead = plan.notice_s if plan.notice_s is not None else sim.models.notice_s
        notice = lead if self.evacuation_s is not None else 0.0
        hit_ps = cluster.ps_transient and plan.hits("ps")
        ps_source = LifetimeRevocations(self.lifetimes.draw) if revocations is None else source
        ps_kernel = PsServerKernel(ps_source if hit_ps else None, notice_s=notice,
                                   replace=cluster.replacement != "none")
        config = run_config_for("simulated", steps=job.total_steps, workers=cluster.n_workers, sync=job.sync,
                                checkpoint_every=job.checkpoint_every_steps, hit_workers=plan.hits("worker"),
                                hit_ps=hit_ps, ps_notice_s=notice, replace_ps=cluster.replacement != "none",
                                replacement_timeout_s=cluster.replacement_timeout_s, warm_spares=cluster.warm_spares,
                                topology=cluster.topology)
        self.controller = RunController(config, kernel, ps_kernel)
        self.workers: dict[int, ServerSpec] = {}  # live worker servers, billed
        self._awaiting_capacity: set[int] = set()  # replacements asked for while the market has no capacity
        self.training: set[int] = set()
        self._counts = [0] * len(sim.gpus)  # workers training per GPU type (kept with ``training``)
        self.ps_billed = cluster.ps
        self.num_shards = cluster.ps
        self.result_done = self.env.event()
        self.ended: C.EndRun | None = None
        self._pending: list[E.Event] = []
        self._busy = False
        self.spare_ready: dict[int, float] = {}  # warm spare -> when its server is (or will be) ready
        first = self.controller.start(sim._specs, self._ps_spec(), cluster.ps, 0, wall=0.0, now=0.0, up=True)
        for spec in sim._specs:  # billing order as before the controller: on-demand, PS, transient (same sums)
            if not spec.transient:
                self._bill(self._price_s(spec))
        self._bill(cluster.ps * sim._ps_price_s)
        for spec in sim._specs:
            if spec.transient:
                self._bill(self._price_s(spec))
        self._run(first)
        horizon = self.env.timeout(HORIZON_FACTOR * sim.base_time_s)
        horizon.callbacks.append(self._give_up)

    def _ps_spec(self) -> ServerSpec:
        cluster = self.sim.cluster
        return ServerSpec(None, getattr(self.sim.models.prices, "cloud", "gcp"), cluster.region, cluster.ps_transient,
                          self.sim._ps_price_s * 3600, role="ps")

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _bill(self, delta_per_s: float) -> None:
        now = self.env.now
        self.cost_usd += self.cost_per_s * (now - self.t_bill)
        self.t_bill = now
        self.cost_per_s += delta_per_s

    def _price_s(self, spec: ServerSpec) -> float:
        return self.sim.price_s(spec)

    def _advance(self) -> None:
        now = self.env.now
        self.progress = min(self.total, self.progress + self.speed * (now - self.t_last))
        self.t_last = now

    def _reschedule(self) -> None:
        """The speed of the workers training now; the next moment something happens (the fence, or the
        controller's next cloud event)."""
        self.gen += 1
        gen = self.gen
        controller = self.controller
        self.speed = 0.0
        if self.training:
            chief = controller.workers.chief
            chief = chief if chief in self.workers else min(self.training)
            chief_gpu = self.sim.index_of(self.workers[chief].gpu_type)
            self.speed = self.sim.rate(tuple(self._counts), chief_gpu, self.num_shards) * self.speed_factor
        at = controller.next_wakeup()
        if self.speed > 0:
            at = min(self._at_whole_step(at), self.env.now + (self._stop_step() - self.progress) / self.speed)
        if math.isfinite(at):
            ev = self.env.timeout(max(0.0, at - self.env.now))
            ev.callbacks.append(lambda _ev: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self.gen or self.ended is not None:
            return
        self._advance()
        fence = self._stop_step()
        if self.training and self.progress >= fence - 1e-9 * max(1.0, fence):
            self.progress = fence
            self._stop_all()
            self._feed([E.AllStopped(wall=self.env.now, now=self.env.now, global_step=fence)])
        else:
            self._feed([self._tick()])

    def _tick(self) -> E.Tick:
        return E.Tick(wall=self.env.now, now=self.env.now, global_step=self.progress)

    def _feed(self, events: list[E.Event]) -> None:
        self._pending.extend(events)
        if self._busy:
            return
        self._busy = True
        try:
            while self._pending and self.ended is None:
                self._run(self.controller.handle(self._pending.pop(0)))
        finally:
            self._busy = False
        if self.ended is None:
            self._reschedule()

    def _feed_at_once(self, events: list[E.Event]) -> None:
        """Events of one instant (a Tick with the progress, then what happened), decided at once."""
        if self._busy:
            self._pending.extend(events)
            return
        self._busy = True
        try:
            self._run(self.controller.handle_all(events))
        finally:
            self._busy = False
        self._feed([])

    def _run(self, commands: list[C.Command]) -> None:
        for c in commands:
            self._handlers[type(c)](c)
        if not self._busy:
            self._feed([])

    def _later(self, delay: float, event: Any) -> None:
        ev = self.env.timeout(max(0.0, delay))
        ev.callbacks.append(lambda _ev: self._fire(event))

    def _fire(self, event: Any) -> None:
        if self.ended is not None:
            return
        self._advance()
        if (wait := self._at_whole_step(self.env.now) - self.env.now) > 0:  # mid-step: at the step's end
            self._later(wait, event)
            return
        self._feed_at_once([self._tick(), event(self.env.now) if callable(event) else event])

    def _at_whole_step(self, at: float) -> float:
        """When a cloud event due ``at`` takes effect: then; with the models' ``event_steps`` while workers train, at
        the first multiple of that many steps reached by then (the speed holds until the next event)."""
        every = self.sim.models.event_steps
        if not every or self.speed <= 0 or not math.isfinite(at):
            return at
        step = self.progress + (at - self.t_last) * self.speed
        whole = every * math.ceil(step / every - 1e-6)  # an event within a millionth of a step of one: at that one
        return self.t_last + (min(whole, self._stop_step()) - self.progress) / self.speed

    def _stop_step(self) -> float:
        """Where training stops next: the fence, or the last step."""
        return min(self.fence, self.total)

    def _give_up(self, _ev: simpy.Event) -> None:
        if not self.result_done.triggered:
            self._advance()
            self.result_done.succeed(False)

    # -- commands ---------------------------------------------------------------------------------------
    def _do_Fence(self, c: C.Fence) -> None:
        self.fence = c.step

    def _do_Train(self, c: C.Train) -> None:
        if c.worker_id not in self.training:
            self.training.add(c.worker_id)
            self._count(self.workers[c.worker_id].gpu_type, +1)

    def _count(self, gpu: str, change: int) -> None:
        """Workers of ``gpu`` training, counted per GPU type (a type a replacement brought gets a count)."""
        index = self.sim.index_of(gpu)
        if index >= len(self._counts):
            self._counts += [0] * (index + 1 - len(self._counts))
        self._counts[index] += change

    def _stop_all(self) -> None:
        self.training = set()
        self._counts = [0] * len(self._counts)

    def _do_HoldAll(self, c: C.HoldAll) -> None:
        self._stop_all()
        self._pending.append(E.AllStopped(wall=self.env.now, now=self.env.now, global_step=self.progress))

    def _do_StartWorker(self, c: C.StartWorker) -> None:
        self.workers[c.worker_id] = c.spec
        now = self.env.now
        if c.replaces is None:  # the first wave (billed above): up from the start
            return
        self.lifetimes.replaced(c.slot, c.spec.gpu_type)
        self.replacements += 1
        if c.spare is not None:  # a warm spare's server becomes the worker's (billed already): the rest of its start
            wait, delay = 0.0, max(0.0, self.spare_ready.pop(c.spare) - now)
        else:
            delay = self._startup_s(c.spec)
            capacity = getattr(self.sim.models.lifetimes, "capacity_wait", None)
            # a spot replacement first waits for capacity (no server, nothing billed), then starts up
            wait = capacity(self.rng, c.spec.gpu_type, c.spec.region) if capacity is not None and c.spec.transient \
                else 0
            if wait > 0:
                del self.workers[c.worker_id]
                self._awaiting_capacity.add(c.worker_id)
                self.env.timeout(wait).callbacks.append(lambda _ev: self._capacity_came(c.worker_id, c.spec))
            else:
                self._bill(self._price_s(c.spec))
        self._pending.append(E.ServerStarting(wall=now, now=now, worker_id=c.worker_id, startup_s=wait + delay))
        self._later(wait + delay, lambda t: E.WorkerUp(wall=t, now=t, worker_id=c.worker_id))

    def _do_StartSpare(self, c: C.StartSpare) -> None:
        """A warm spare: its server billed from now, like any server, and up after a start-up drawn now."""
        now = self.env.now
        self._bill(self._price_s(c.spec))
        startup = self._startup_s(c.spec)
        self.spare_ready[c.key] = now + startup
        self._pending.append(E.ServerStarting(wall=now, now=now, spare=c.key, startup_s=startup))
        self._later(startup, lambda t: E.SpareUp(wall=t, now=t, key=c.key))

    def _do_CloseSpares(self, c: C.CloseSpares) -> None:
        """No simulated spare dies before it is up: never asked."""

    def _startup_s(self, spec: ServerSpec) -> float:
        """One start-up delay of a server of ``spec`` (the start-up model's draw)."""
        return float(self.sim.models.startup.sample(self.rng, spec.gpu_type, True, spec.region))

    def _capacity_came(self, worker_id: int, spec: ServerSpec) -> None:
        """Capacity for a waiting replacement: its server exists (and is billed) from now."""
        if self.ended is None and worker_id in self._awaiting_capacity:
            self._awaiting_capacity.discard(worker_id)
            self.workers[worker_id] = spec
            self._bill(self._price_s(spec))

    def _end_worker(self, worker_id: int) -> None:
        self._awaiting_capacity.discard(worker_id)  # given up before any server came: nothing billed
        spec = self.workers.pop(worker_id, None)
        if worker_id in self.training:
            self.training.discard(worker_id)
            self._count(spec.gpu_type, -1)  # type: ignore[union-attr]  # training: live
        if spec is not None:
            self._bill(-self._price_s(spec))

    def _do_Revoke(self, c: C.Revoke) -> None:
        self.revoked.add(c.worker_id)
        self._end_worker(c.worker_id)

    def _do_LoseWorker(self, c: C.LoseWorker) -> None:
        self._end_worker(c.worker_id)

    def _do_ReleaseWorker(self, c: C.ReleaseWorker) -> None:
        self._end_worker(c.worker_id)

    def _do_Joined(self, c: C.Joined) -> None:
        pass

    def _do_CancelWorker(self, c: C.CancelWorker) -> None:
        self._end_worker(c.worker_id)

    def _do_SetChief(self, c: C.SetChief) -> None:
        pass

    def _do_SetLrScale(self, c: C.SetLrScale) -> None:
        pass

    def _do_SetRoundSize(self, c: C.SetRoundSize) -> None:
        pass

    def _do_StartDuty(self, c: C.StartDuty) -> None:
        now = self.env.now
        self._pending.append(E.DutyDone(wall=now, now=now, kind=c.kind, worker_id=c.worker_id, step=c.step))

    def _do_StartPs(self, c: C.StartPs) -> None:
        delay = float(self.sim.models.startup.sample(self.rng, PS_SERVER, True, self.sim.cluster.region))
        self.replacements += 1
        self.ps_billed += 1
        self._bill(self.sim._ps_price_s)
        now = self.env.now
        self._pending.append(E.ServerStarting(wall=now, now=now, key=c.key, startup_s=delay))
        self._later(delay, lambda t: E.PsUp(wall=t, now=t, key=c.key))

    def _end_ps(self, key: int) -> None:
        self.revoked.add(key)
        self.ps_billed -= 1
        self._bill(-self.sim._ps_price_s)

    def _action(self, name: ShardAction, pause_s: float, **kw: Any) -> None:
        """An action on quiesced shards that takes ``pause_s`` (training stands still meanwhile)."""
        self._later(pause_s, lambda t: E.ActionDone(wall=t, now=t, action=name, num_shards=self.num_shards, **kw))

    def _do_EvacuatePs(self, c: C.EvacuatePs) -> None:
        self._end_ps(c.key)
        self.evacuations += 1
        if c.onto == Destination.SURVIVORS:
            self.num_shards -= 1
        self._action(ShardAction.EVACUATE, self.evacuation_s or 0.0)

    def _do_ParkPs(self, c: C.ParkPs) -> None:
        self._end_ps(c.key)
        self.parks += 1
        self._action(ShardAction.PARK, 0.0)

    def _do_UnparkPs(self, c: C.UnparkPs) -> None:
        self.evacuations += 1
        self._action(ShardAction.UNPARK, self.evacuation_s or 0.0)

    def _do_FillPs(self, c: C.FillPs) -> None:
        self.num_shards += 1
        self._action(ShardAction.FILL, self.evacuation_s or 0.0)

    def _do_PsNoticed(self, c: C.PsNoticed) -> None:
        pass

    def _do_KillPs(self, c: C.KillPs) -> None:
        self._end_ps(c.key)

    def _do_Restore(self, c: C.Restore) -> None:
        """Every shard rolls back to the checkpoint the controller names (None: the start, step 0)."""
        self._back_to(c.checkpoint)

    def _back_to(self, checkpoint: int | None) -> None:
        """Training state goes back to ``checkpoint`` (None: the start, step 0): the steps since are lost."""
        kept = checkpoint or 0
        self.steps_lost += max(0.0, self.progress - kept)
        self.progress = float(kept)
        self._action(ShardAction.RESTORE, 0.0, step=kept)

    def _do_Regroup(self, c: C.Regroup) -> None:
        """An all-reduce group re-formed at its new size: :data:`REGROUP_S` from a member's state, or back to the
        checkpoint the controller names when no member holds the state (as a restore)."""
        if c.root is not None:
            self._action(ShardAction.REGROUP, REGROUP_S)
        else:
            self._back_to(c.checkpoint)

    def _do_ChangePlacement(self, c: C.ChangePlacement) -> None:
        self._action(ShardAction.PLACEMENT, 0.0)

    def _do_Balance(self, c: C.Balance) -> None:
        """No shard loads are simulated: the balancers have nothing to decide on."""
        self._pending.append(E.ShardLoads(wall=self.env.now, now=self.env.now, global_step=c.step, balance=True))

    def _do_Note(self, c: C.Note) -> None:
        """Nothing is recorded of a simulated run but its result."""

    def _do_Probe(self, c: C.Probe) -> None:
        self._pending.append(E.ProbeDone(wall=self.env.now, now=self.env.now))

    def _do_EndRun(self, c: C.EndRun) -> None:
        """The run ends: finished now; a run that failed (no worker left) never finishes the job, so it counts
        as stopped at the horizon, its live servers billed until then (as a user would, unaware)."""
        self.ended = c
        if c.status == "finished" and not self.result_done.triggered:
            self.result_done.succeed(True)

    def result(self) -> RunResult:
        """Run to completion (or the horizon) and return the run's figures."""
        finished = self.env.run(until=self.result_done)
        self._bill(0.0)
        return RunResult(
            wall_time_s=float(self.env.now),
            cost_usd=self.cost_usd,
            revocations=len(self.revoked),
            replacements=self.replacements,
            steps_lost=self.steps_lost,
            finished=bool(finished),
            evacuations=self.evacuations,
            parks=self.parks,
        )

    @property
    def kernel(self) -> MembershipKernel:
        return self.controller.kernel
