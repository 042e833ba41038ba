"""The run controller: a training run's whole decision logic as one object, typed events in, typed commands out.

No Ray, SimPy, threads, sleeps or clocks in here: time comes in with each event (or, in emulation, from the
training progress events report), so a test steps a run in milliseconds and the Ray trainer
(:mod:`cmdare.train.run.ray_driver`, :mod:`cmdare.train.allreduce.allreduce_driver`) and the simulator
(:mod:`cmdare.plan.sim_driver`) drive the very same object.

How a pass goes (:meth:`RunController.handle`): the event updates the records; then cloud events due by now
are decided (revocations, PS notices and deadlines, replacements that are ready or too late), the run ends
if it must (no worker left, a worker that cannot start, no progress), actions that need quiesced shards run
one at a time while training holds (restore, evacuate, park, unpark, fill, placement changes, a synchronous
round that grows), and otherwise training goes on up to the *fence*: the next step something is due at (a
duty, the target; in emulation also the step at which the next cloud event falls). When
every worker has stopped at the fence (a barrier) the duties of that step start on the chief and the next
fence is set.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.allreduce_topology import AllReduceTopology
from cmdare.control.balancers import DecisionSource
from cmdare.control.dispatch import handler_table
from cmdare.control.divergence import DivergenceWatch
from cmdare.control.duties import DutySchedule
from cmdare.control.emulated_clock import EmulatedClock
from cmdare.control.event_handlers import RunEventHandlers
from cmdare.control.kernel import MembershipKernel
from cmdare.control.kinds import DutyKind
from cmdare.control.liveness import Liveness
from cmdare.control.ps_servers import PsServerKernel
from cmdare.control.ps_topology import PsTopology
from cmdare.control.run_commands import (
    Command,
    Fence,
    HoldAll,
    StartDuty,
    Train,
)
from cmdare.control.run_config import RunConfig
from cmdare.control.run_end import RunEnding
from cmdare.control.run_events import (
    ActionDone,
    AllStopped,
    CheckpointStored,
    ChunkDone,
    DutyDone,
    Event,
    ProbeDone,
    PsUp,
    WorkerStopped,
    WorkerUp,
)
from cmdare.control.run_state import Ended, Finishing, Holding, Phase, RunState, RunStateMachine, Starting, Training
from cmdare.control.saved_run import SavedRun
from cmdare.control.spares import WarmSpares
from cmdare.control.topology import Topology
from cmdare.control.worker_control import WorkerControl
from cmdare.ps.placement import Placement

__all__ = ["RunController"]

#: Events that show the cluster is alive: a probe is due only after none for ``probe_after_s``.
_SIGNS_OF_LIFE = (ChunkDone, WorkerStopped, AllStopped, WorkerUp, PsUp, DutyDone, ActionDone, ProbeDone,
                  CheckpointStored)


class RunController(SavedRun, RunEnding, RunEventHandlers):
    """Decides a run: feed it events with :meth:`handle`, carry out the commands it returns.

    Args:
        config: the run (target, workers, duties, time-outs; :class:`~cmdare.control.run_config.RunConfig`).
        kernel: the membership kernel (policies: replacement, chief, LR; the revocation source).
        ps_kernel: the PS-server kernel of the default topology, a parameter server (notice lead, evacuation
            policy; the same revocation source when injected revocations hit PS servers).
        clock: an emulated clock: cloud time advances with the training progress events report (local
            emulation); None: every event brings cloud time as ``now`` (the simulator, a real cluster).
        balancer, placement: the parameter server's placement sources (:mod:`cmdare.control.balancers`) and its
            placement at the start (None: the driver keeps none, as the simulator).

    The controller is the *fleet* (servers, lifetimes, notices, replacements, liveness, duties, the chief, the
    learning rate, the run's end); how the members train together is its :attr:`topology`
    (:class:`~cmdare.control.topology.Topology`: :class:`~cmdare.control.ps_topology.PsTopology` by default,
    :class:`~cmdare.control.allreduce_topology.AllReduceTopology` with ``config.topology="allreduce"``).
    """

    def __init__(self, config: RunConfig, kernel: MembershipKernel, ps_kernel: PsServerKernel | None = None,
                 clock: EmulatedClock | None = None, *, balancer: DecisionSource | None = None,
                 placement: Placement | None = None):
        self.config, self.clock = config, clock
        self.out: list[Command] = []
        self.spares = WarmSpares(config.warm_spares, self.out)
        self.workers = WorkerControl(config, kernel, self.out, self.spares)
        self.duties = DutySchedule(config.checkpoint_every, config.eval_every, config.steps)
        self.topology: Topology = (
            AllReduceTopology(config, self.out, self.duties) if config.topology == "allreduce" else
            PsTopology(config, ps_kernel or PsServerKernel(), self.out, balancer, placement, self.duties))
        self.machine = RunStateMachine()
        self.phase: Phase = Starting()
        self.step: float = 0
        self.fence = 0
        self.now = 0.0
        self.due_now = 0.0  # now, give or take the rounding of emulated time: what falls due by then is due
        self.wall = 0.0
        self.holding = False
        self.started = False  # training began (the first wave was up)
        self.action: Command | None = None  # the action on quiesced state under way
        self.liveness = Liveness(config.probe_after_s, config.stuck_after_s)
        self.failed_uploads_in_a_row = 0
        self.target = config.steps  # the step training stops at: the run's steps, or where a requested stop falls
        self.stop_wall: float | None = None  # wall time a stop was requested (Ctrl-C, SIGTERM)
        self.stop_why = ""
        self.rollbacks = 0  # rollbacks after a divergence
        self.divergence = DivergenceWatch()
        self.last_upload_error = ""
        self.final_upload_since: float | None = None  # wall time the end began waiting for the final upload
        self.transitions: list[tuple[float, RunState, RunState]] = []
        #: The decisions taken: ``(cloud time, global step, command)`` of every command but the feeding of
        #: workers (Train, Fence, HoldAll), so two drivers' runs can be compared decision by decision.
        self.history: list[tuple[float, float, Command]] = []
        self._saved: dict[str, Any] = {}  # the state of the run this one resumes (restore_state)
        self._wave: list[dict] = []  # the first wave's server specs (a resumed run's fleet is the saved one's if equal)
        # every kind of event, the fleet's or the topology's, or it fails here
        self._handlers = handler_table((self, self.topology), "_on_", Event)

    # -- views ----------------------------------------------------------------------------------------
    @property
    def state(self) -> RunState:
        return self.machine.state

    @property
    def ended(self) -> bool:
        return isinstance(self.phase, Ended)

    @property
    def kernel(self) -> MembershipKernel:
        return self.workers.kernel

    def rate(self) -> float:
        """The emulated cluster's steps per cloud second now."""
        return self.topology.rate(self.workers)

    # -- the run -------------------------------------------------------------------------------------
    def start(self, worker_specs: Sequence[ServerSpec], ps_spec: ServerSpec, num_ps: int, step: int,
              wall: float, now: float | None = None, up: bool = False) -> list[Command]:
        """The run starts at ``step``: the first wave of workers (one per data slot) and ``num_ps`` shards;
        ``up``: the first wave's processes are up already (the simulator; else each sends ``WorkerUp``)."""
        self.out.clear()
        self.wall = self.workers.wall = wall
        self.liveness.restart(wall)
        if self.clock is not None:
            self.clock.rebase(step)
            now = self.clock.time
        self.now = float(now if now is not None else wall)
        self.topology.at(self.now, wall)
        self.step = self.fence = step
        self.duties.restart(step)
        self.duties.resume(self._saved.get("duties", []))
        self._wave = [spec.as_dict() for spec in worker_specs]
        if not self._resume_fleet(ps_spec, num_ps, step, wall, up):
            self.topology.start(ps_spec, num_ps, self.now, step)
            self.workers.start_wave(worker_specs, self.now, wall, up)
            self.spares.start(worker_specs, self.now)
        self._settle()
        self._record()
        return list(self.out)

    def handle(self, event: Event) -> list[Command]:
        """Take one event; returns the commands to carry out, in order."""
        return self.handle_all((event,))

    def handle_all(self, events: Sequence[Event]) -> list[Command]:
        """Take events that happened at once (the same instant, in order), then decide once; returns the
        commands to carry out, in order."""
        self.out.clear()
        if self.ended:
            return []
        for event in events:
            handler = self._handlers.get(type(event))
            if handler is None:
                raise TypeError(f"the run controller takes no {type(event).__name__}")
            self._time(event)
            if isinstance(event, _SIGNS_OF_LIFE) and getattr(event, "ok", True):
                self.liveness.heard(self.wall)  # the cluster answers (a failure report is no sign of life)
            handler(event)
        self._settle()
        self._record()
        return list(self.out)

    def _record(self) -> None:
        self.history += [(self.now, self.step, c) for c in self.out if not isinstance(c, Train | Fence | HoldAll)]

    def next_wakeup(self) -> float:
        """When the driver should wake the controller (a Tick) at the latest, on its own clock: cloud events
        (for drivers that keep cloud time) and deadlines on real waits (inf: none)."""
        times = [t for t in (self.workers.next_wall(), self.topology.next_wall()) if t > self.wall]
        times.append(self.liveness.next_wall())
        if self.stop_wall is not None:
            times.append(self.stop_wall + self.config.stop_timeout_s)
        if self.clock is None:
            times.append(self._next_cloud_time())
        return min(times, default=math.inf)

    # -- decisions -----------------------------------------------------------------------------------
    def _settle(self) -> None:
        if self.ended:
            return
        if self.stop_wall is not None and self.wall - self.stop_wall >= self.config.stop_timeout_s:
            self._end("interrupted", f"{self.stop_why} at step {int(self.step)}: its checkpoint was not stored within "
                                     f"{self.config.stop_timeout_s:g} s; {self._resume_hint()}")
            return
        now = self.due_now = self.now
        if self.clock is not None:  # emulated time is a sum of step times: what falls due at this step is due now
            now = self.due_now = now + 1e-9 * max(1.0, abs(now))
        finishing = isinstance(self.phase, Finishing)
        barrier = self._quiesced() and self.action is None
        if not finishing and not self.config.virtual_duties and self.step >= self.fence and barrier:
            self.duties.due(int(self.step))  # a barrier: the step's duties take the shards' state before anything else
            self._start_duties()
        # Once the target step is reached the cluster trains no more: nothing is revoked. In emulation cloud events
        # fall at a fence: they are decided at the barrier, once every worker stopped there.
        if not finishing and (self.clock is None or barrier):
            picked = self.workers.revoke_due(self.now, self.topology.candidates(), due_by=now)
            self.topology.tick(self.now, picked, due_by=now)
        self.workers.admit_ready(now)
        self.workers.expire(now, self.wall)
        self.topology.expire(self.wall)
        self.topology.membership(self.workers)
        if self.topology.failure is not None:
            self._end("failed", f"{self.topology.failure}; {self._resume_hint()}")
            return
        if self.workers.no_workers_left and not self.workers.active:
            self._end("failed", "every worker was lost and no replacement is coming: no worker left to train "
                                f"({self._resume_hint()})")
            return
        self._liveness()
        if self.ended:
            return
        if self.config.virtual_duties:
            self.duties.catch_up(self.step)
        if not finishing and self._hold():  # a restore, an evacuation ... comes before the end
            return
        if finishing or (self.step >= self.target and self._quiesced()):
            self._finishing()
            return
        self._balance()
        self._barrier()
        self._start_duties()
        self._feed()
        self._report()

    def _quiesced(self) -> bool:
        return not self.workers.training()

    def _hold(self) -> bool:
        """What the topology must do on quiesced state (:meth:`Topology.quiesce`): hold training, run the actions
        one at a time. True while they keep it held."""
        if self.action is not None:
            return True
        quiesce = self.topology.quiesce(self.due_now, self.workers, self._quiesced())
        if quiesce is None:
            return False
        if not self.holding:
            self.holding = True
            self.out.append(HoldAll(quiesce.why))
        if quiesce.action is not None:
            self.action = quiesce.action
            self.out.append(quiesce.action)
        elif quiesce.then is not None:
            self.out.append(quiesce.then)
            return False
        self._report()
        return True

    def _balance(self) -> None:
        """A balancing step passed: the topology may ask for its state's balance to be checked."""
        if (command := self.topology.balance(int(self.step))) is not None:
            self.out.append(command)

    def _barrier(self) -> None:
        """Every worker stopped (at the fence, or held): set the next fence."""
        if not self._quiesced():
            wanted = self._fence_wanted()
            if wanted < self.fence:  # something new falls due sooner (a replacement, a notice): stop there
                if self.topology.lockstep:  # a lockstep round must not be cut in two: stop after the chunks
                    if not self.holding:
                        self.holding = True
                        self.out.append(HoldAll("fence"))
                    return
                self.fence = max(wanted, int(math.ceil(self.step)))
                self.out.append(Fence(self.fence))
            return
        fence = self._fence_wanted()
        if fence != self.fence:
            self.fence = fence
            self.out.append(Fence(fence))

    def _fence_wanted(self) -> int:
        """The next step training must stop at: a duty, the target; in emulation also the step
        at which the next cloud event falls. Never below the next whole step."""
        steps = [self.target]
        if not self.config.virtual_duties and (at := self.duties.next_step()) is not None:
            steps.append(at)
        if self.clock is not None:
            at = self.clock.step_at(self._next_cloud_time(), self.rate())
            if at is not None:
                steps.append(at)
            if self.workers.unanswered() or self.topology.unanswered():
                # a server asked for, its start-up not heard yet (the driver answers in the same breath): it may be
                # ready at once, and a fence lowered after chunks went out with a higher one races their steps
                steps.append(int(math.floor(self.step)) + 1)
        return max(min(steps), int(math.floor(self.step)) + 1)

    def _start_duties(self) -> None:
        """Start every waiting duty on the chief, once it is stopped (it runs them in order); not while a shard is
        dead or parked (its state cannot be taken)."""
        if self.topology.blocked(self.due_now):
            return
        chief = self.workers.chief
        rec = self.workers.rec(chief) if chief is not None else None
        if rec is None or not rec.active or self.workers.is_training(rec.worker_id) or rec.leaving:
            return
        for duty in self.duties.waiting():
            if duty.reason == "notice":
                continue
            self._run_duty(duty, rec)

    def _run_duty(self, duty, rec) -> None:
        self.duties.started(duty, rec.worker_id)
        rec.duties += 1
        why = {"schedule": f"every {self.duties.every(duty.kind)} steps", "notice": "the chief's server was noticed",
               "retry": "the last try was cut short"}.get(duty.reason, duty.reason)
        state = json.dumps(self.saved_state(), sort_keys=True) if duty.kind == DutyKind.CHECKPOINT else ""
        self.out.append(StartDuty(duty.kind, rec.worker_id, duty.step, duty.final, duty.reason, state,
                                  why="the run's end" if duty.final else why))

    def _feed(self) -> None:
        """Every idle member trains on, if the fence is ahead. Training starts once the whole first wave is up (its
        start-up is no part of the run: every first-wave worker trains from the first step).

        A synchronous round starts with all its workers: none is told to train while another member of the round
        is busy (the chief's duty) or still finishing its chunk. A member told to train alone pushes and waits at
        the shards' barrier for the others; a hold that comes meanwhile (a replacement PS up, a shard to park)
        waits for every worker to stop, so the others would never be told to train and it would never stop."""
        if self.step >= self.fence:
            return
        if not self.started and any(not r.up for r in self.workers.active.values() if r.replaces is None):
            return
        self.started = True
        trainable = self.workers.trainable()
        if not trainable:
            return
        if self.topology.lockstep and (self.workers.training() or len(trainable) < self.workers.counted()):
            return
        if not self.workers.training():  # training (re)starts: the silence and progress deadlines too
            self.liveness.restart(self.wall)
        self.holding = False
        for rec in trainable:
            self.workers.start_training(rec)
            self.out.append(Train(rec.worker_id))

    def _report(self) -> None:
        """The phase and reported state after a pass: running, degraded (fewer workers than planned) or
        restoring; holding while actions on quiesced shards run."""
        if isinstance(self.phase, Finishing | Ended):
            return
        if self.holding:
            name = type(self.action).__name__ if self.action is not None else None
            self.phase = Holding((name or "quiesce",), name)
        else:
            self.phase = Training(self.fence)
        if self.topology.restoring:
            self._to(RunState.RESTORING)
        elif len(self.workers.active) < self.config.workers:
            self._to(RunState.DEGRADED)
        else:
            self._to(RunState.RUNNING)

    def _to(self, state: RunState) -> None:
        if self.machine.state == RunState.STARTING and state not in (RunState.RUNNING, RunState.FAILED):
            self._to(RunState.RUNNING)  # training starts before it can degrade or restore
        previous = self.machine.state
        if self.machine.to(state, self.now):
            self.transitions.append((self.now, previous, state))
