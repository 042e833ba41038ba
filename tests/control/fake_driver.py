"""A fake driver for the run controller's scenario tests: a toy world with no Ray, no SimPy and no sleep.

It carries out the controller's commands in a deterministic discrete-event world on its own virtual wall
clock: every worker that trains pushes one step per ``step_wall_s``, in turn (asynchronous) or together
(synchronous rounds: a worker that pushed waits at the shards' barrier until the round completes, and only
then can it stop); shards refuse pushes past the fence; a server's process is up ``up_wall_s`` after it was
asked for; duties, uploads and shard actions take ``action_wall_s``. A run of hundreds of steps takes
milliseconds. Tests script the world through hooks (``on_step``: call a function at a global step;
``on_duty``: as the duty of a step ends, before it is reported) and read what happened from ``commands`` and
``log``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.controller import RunController
from cmdare.control.dispatch import handler_table


@dataclass
class FakeWorker:
    worker_id: int
    slot: int
    up: bool = False
    alive: bool = True
    training: bool = False
    halting: bool = False  # told to stop while waiting at a synchronous round's barrier: stops when it completes
    doomed: str | None = None  # its constructor raises this
    trains: int = 0  # Train commands it was given (a hold's stop is for the chunk it was training then)


@dataclass
class FakeDriver:
    controller: RunController
    step_wall_s: float = 0.01
    chunk_steps: int = 5
    up_wall_s: float = 0.5
    replacement_up_wall_s: float | None = None  # a replacement's process start, if not up_wall_s
    action_wall_s: float = 0.05
    startup_s: float = 0.0  # emulated cloud seconds of every server's start-up
    ps_startup_s: float | None = None
    ps_up_wall_s: float | None = None  # a replacement PS's process start, if not up_wall_s (inf: never by itself)
    fail_start: dict[int, str] = field(default_factory=dict)  # worker id -> constructor error
    dead_spares: set[int] = field(default_factory=set)  # warm spares that die before they are up
    spares: dict[int, bool] = field(default_factory=dict)  # warm spare -> whether its process is up
    stuck: bool = False  # the world stops answering (a dead Ray node)
    frozen_shard: bool = False  # a shard stops answering (a stopped process): every push waits on it until a probe
    failing_uploads: set[int] = field(default_factory=set)  # steps whose checkpoint upload fails (a full disk)
    stalled_uploads: set[int] = field(default_factory=set)  # steps whose upload never ends
    slow_uploads: dict[int, float] = field(default_factory=dict)  # step -> wall seconds its upload takes (else 0)
    placement: Any = None  # the shards' placement, where the test gives one: moves change it, ActionDone says so
    loss_at: Callable[[int], float] | None = None  # the training loss chunks report, by global step (None: none)
    test_loss: dict[int, float] = field(default_factory=dict)  # an evaluation's test loss, by its step (else 1.0)
    real_time: bool = False  # cloud time is this driver's clock (a real cluster): every event brings it
    wall: float = 0.0
    step: int = 0
    fence: int = 0
    workers: dict[int, FakeWorker] = field(default_factory=dict)
    commands: list[Any] = field(default_factory=list)
    log: list[tuple[float, int, Any]] = field(default_factory=list)  # (wall, step, command)
    on_step: dict[int, Callable[[FakeDriver], None]] = field(default_factory=dict)
    on_duty: dict[int, Callable[[FakeDriver], None]] = field(default_factory=dict)  # duty step -> hook
    stored: list[int] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)  # the wall times of the probes asked for
    regroups: list[Any] = field(default_factory=list)  # the Regroup commands carried out (an all-reduce run)
    ended: C.EndRun | None = None
    num_shards: int = 1
    steps_lost: int = 0
    round: list[int] = field(default_factory=list)  # synchronous: workers that pushed this round
    round_size: int = 0
    _queue: list = field(default_factory=list)
    _seq: Any = field(default_factory=itertools.count)
    _since_report: dict[int, int] = field(default_factory=dict)
    _busy: bool = False
    _pending: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._handlers = handler_table(self, "_do_", C.Command)  # every kind of command, or it fails here

    # -- the event queue ------------------------------------------------------------------------------
    def later(self, delay: float, event_or_fn: Any) -> None:
        heapq.heappush(self._queue, (self.wall + delay, next(self._seq), event_or_fn))

    def feed(self, event: E.Event) -> None:
        """Hand ``event`` to the controller and carry out its commands; events they raise wait for the end of
        the batch (a driver never re-enters the controller while carrying out its commands)."""
        if self._busy:
            self._pending.append(event)
            return
        self._busy = True
        try:
            self.execute(self._handle(event))
            while self._pending:
                self.execute(self._handle(self._pending.pop(0)))
        finally:
            self._busy = False

    def _handle(self, event: E.Event) -> list[Any]:
        if self.real_time:
            event = type(event)(**{**event.__dict__, "now": event.wall})
        return self.controller.handle(event)

    def execute(self, commands: list[Any]) -> None:
        for c in commands:
            self.commands.append(c)
            self.log.append((self.wall, self.step, c))
            self._handlers[type(c)](c)

    # -- running --------------------------------------------------------------------------------------
    def start(self, specs, ps_spec, num_ps: int = 1, step: int = 0) -> None:
        self.num_shards, self.step, self.fence, self.start_step = num_ps, step, step, step
        self.round_size = len(specs)
        self.stored = [step] if step else []
        self._busy = True
        self.execute(self.controller.start(specs, ps_spec, num_ps, step, self.wall))
        self._busy = False
        while self._pending:
            self.feed(self._pending.pop(0))

    def run(self, max_wall: float = 1e6) -> C.EndRun | None:
        while self.ended is None and self.wall < max_wall:
            training = [w for w in self.workers.values() if w.training and w.alive and w.up]
            blocked = self.stuck or self.frozen_shard
            next_push = self.wall + self.step_wall_s if training and not blocked else float("inf")
            next_event = self._queue[0][0] if self._queue else float("inf")
            wake = self.controller.next_wakeup()
            at = min(next_push, next_event, max(wake, self.wall))
            if at == float("inf"):
                at = self.wall + 1.0  # nothing scheduled: a tick lets emulated time jump
            self.wall = at
            if self._queue and self._queue[0][0] <= self.wall:
                _, _, item = heapq.heappop(self._queue)
                self.feed(item) if isinstance(item, E.Event) else item()
            elif next_push <= self.wall:
                self._push(training)
            else:
                self.feed(E.Tick(wall=self.wall))
        return self.ended

    def _push(self, training: list[FakeWorker]) -> None:
        sync = self.controller.config.sync
        if sync:
            pushers = [w for w in training if w.worker_id not in self.round]
            if not pushers:
                return
            w = pushers[0]
            if self.step >= self.fence:
                self._stop(w)
                return
            self.round.append(w.worker_id)
            if len(self.round) < self.round_size:
                return
            members, self.round = self.round, []
            self.step += 1
            for wid in members:
                self._stepped(self.workers[wid])
            return
        w = training[self.step % len(training)]
        if self.step >= self.fence:
            for other in training:
                self._stop(other)
            return
        self.step += 1
        self._stepped(w)

    def _stepped(self, w: FakeWorker) -> None:
        hook = self.on_step.pop(self.step, None)
        n = self._since_report.get(w.worker_id, 0) + 1
        self._since_report[w.worker_id] = n
        if n >= self.chunk_steps or self.step >= self.fence:
            self._since_report[w.worker_id] = 0
            self.feed(E.ChunkDone(wall=self.wall, worker_id=w.worker_id, global_step=self.step, steps=n,
                                  loss=self.loss_at(self.step) if self.loss_at else None))
        if (self.step >= self.fence or w.halting) and w.training:
            self._stop(w)
        if hook is not None:
            hook(self)

    def _stop(self, w: FakeWorker) -> None:
        if w.training and self.controller.config.sync and w.worker_id in self.round:
            w.halting = True  # its push waits at the shards' barrier: it stops once the round completes
            return
        if w.training:
            w.training = w.halting = False
            n = self._since_report.pop(w.worker_id, 0)
            if n:
                self.feed(E.ChunkDone(wall=self.wall, worker_id=w.worker_id, global_step=self.step, steps=n,
                                      loss=self.loss_at(self.step) if self.loss_at else None))
            self.feed(E.WorkerStopped(wall=self.wall, worker_id=w.worker_id, global_step=self.step))

    # -- what the tests do to the world ---------------------------------------------------------------
    def notice(self, worker_id: int) -> None:
        """The worker's server gets a preemption notice: it stops and says so."""
        w = self.workers[worker_id]
        w.training = False
        self._since_report.pop(worker_id, None)
        self.feed(E.WorkerNotice(wall=self.wall, worker_id=worker_id, provider="gce"))

    def kill(self, worker_id: int) -> None:
        """The worker's server dies on its own (not injected): its chunk fails."""
        w = self.workers[worker_id]
        w.alive = False
        if w.training:
            w.training = False
            self.later(0.01, E.ChunkFailed(wall=self.wall + 0.01, worker_id=worker_id, error="ActorDiedError"))

    # -- commands ---------------------------------------------------------------------------------------
    def _do_Fence(self, c: C.Fence) -> None:
        self.fence = c.step

    def _do_Train(self, c: C.Train) -> None:
        w = self.workers[c.worker_id]
        assert w.up and w.alive, f"Train for worker {c.worker_id}, which is not up"
        w.training, w.halting = True, False
        w.trains += 1

    def _do_HoldAll(self, c: C.HoldAll) -> None:
        """Training workers stop at the end of their current push; a Train given meanwhile supersedes the hold
        (as the Ray driver feeds a worker again)."""
        for w in self.workers.values():
            if w.training:
                self.later(0.0, lambda w=w, n=w.trains: self._stop(w) if w.trains == n else None)

    def _do_Revoke(self, c: C.Revoke) -> None:
        w = self.workers[c.worker_id]
        w.alive = w.training = False

    def _do_LoseWorker(self, c: C.LoseWorker) -> None:
        self.workers[c.worker_id].alive = False

    def _do_ReleaseWorker(self, c: C.ReleaseWorker) -> None:
        self.workers[c.worker_id].alive = False

    def _do_StartSpare(self, c: C.StartSpare) -> None:
        self.spares[c.key] = False
        self.feed(E.ServerStarting(wall=self.wall, spare=c.key, startup_s=self.startup_s))

        def up() -> None:
            if c.key not in self.spares:
                return  # taken meanwhile
            if c.key in self.dead_spares:
                del self.spares[c.key]
                self.feed(E.SpareLost(wall=self.wall, key=c.key, error="its node died"))
            else:
                self.spares[c.key] = True
                self.feed(E.SpareUp(wall=self.wall, key=c.key))

        self.later(self.up_wall_s, up)

    def _do_CloseSpares(self, c: C.CloseSpares) -> None:
        pass

    def _do_StartWorker(self, c: C.StartWorker) -> None:
        w = self.workers[c.worker_id] = FakeWorker(c.worker_id, c.slot)
        first = c.replaces is None
        if c.spare is not None and self.spares.pop(c.spare, False):  # a warm spare: its server is up, its process
            self.feed(E.ServerStarting(wall=self.wall, worker_id=c.worker_id, startup_s=0.0))  # adopts at once
            w.up = True
            self.feed(E.WorkerUp(wall=self.wall, worker_id=c.worker_id))
            return
        self.feed(E.ServerStarting(wall=self.wall, worker_id=c.worker_id, startup_s=0.0 if first else self.startup_s))
        if c.worker_id in self.fail_start:
            self.later(self.up_wall_s, E.WorkerStartFailed(wall=self.wall + self.up_wall_s, worker_id=c.worker_id,
                                                          error=self.fail_start[c.worker_id], deterministic=True))
            return

        def up() -> None:
            if w.alive:
                w.up = True
                self.feed(E.WorkerUp(wall=self.wall, worker_id=c.worker_id))

        delay = self.up_wall_s if first or self.replacement_up_wall_s is None else self.replacement_up_wall_s
        self.later(delay, up)

    def _do_Joined(self, c: C.Joined) -> None:
        pass

    def _do_CancelWorker(self, c: C.CancelWorker) -> None:
        self.workers[c.worker_id].alive = False

    def _do_SetChief(self, c) -> None:
        pass

    def _do_SetLrScale(self, c) -> None:
        pass

    def _do_SetRoundSize(self, c: C.SetRoundSize) -> None:
        self.round_size = c.n
        if len(self.round) >= c.n:  # a shrink completes a waiting round
            members, self.round = self.round, []
            self.step += 1
            for wid in members:
                self._stepped(self.workers[wid])

    def _do_StartDuty(self, c: C.StartDuty) -> None:
        step = c.step  # the driver took the shards' state of the duty's step when it first ran

        def done() -> None:
            hook = self.on_duty.pop(c.step, None)
            if hook is not None:
                hook(self)
            ok = self.workers[c.worker_id].alive
            loss = self.test_loss.get(c.step, 1.0) if c.kind == "eval" else None
            self.feed(E.DutyDone(wall=self.wall, kind=c.kind, worker_id=c.worker_id, step=c.step, ok=ok, loss=loss))
            if ok and c.kind == "checkpoint" and step in self.failing_uploads:
                self.feed(E.CheckpointFailed(wall=self.wall, step=step, error="No space left on device"))
            elif ok and c.kind == "checkpoint" and step not in self.stalled_uploads:
                def stored() -> None:
                    self.stored.append(step)
                    self.feed(E.CheckpointStored(wall=self.wall, step=step))

                if step in self.slow_uploads:
                    self.later(self.slow_uploads[step], stored)
                else:
                    stored()

        self.later(self.action_wall_s, done)

    def _do_StartPs(self, c: C.StartPs) -> None:
        startup = self.startup_s if self.ps_startup_s is None else self.ps_startup_s
        self.feed(E.ServerStarting(wall=self.wall, key=c.key, startup_s=startup))
        up = self.up_wall_s if self.ps_up_wall_s is None else self.ps_up_wall_s
        if math.isfinite(up):
            self.later(up, E.PsUp(wall=self.wall + up, key=c.key))

    def _action(self, name: str, **kw: Any) -> None:
        self.later(self.action_wall_s, E.ActionDone(wall=self.wall + self.action_wall_s, action=name,
                                                    num_shards=self.num_shards, **kw))

    def _moved(self, moves: tuple) -> dict[str, Any]:
        """The placement after ``moves`` (where this driver keeps one), as a driver reports it."""
        if self.placement is None or not moves:
            return {}
        from cmdare.ps.psld.decisions import apply_decisions

        self.placement = apply_decisions(self.placement, list(moves))
        return {"placement": self.placement, "migrations": ((tuple(moves), 0, self.action_wall_s),)}

    def _do_EvacuatePs(self, c: C.EvacuatePs) -> None:
        if c.onto == "survivors":
            self.num_shards -= 1
        self._action("evacuate", **self._moved(c.moves))

    def _do_ParkPs(self, c: C.ParkPs) -> None:
        self._action("park")

    def _do_UnparkPs(self, c: C.UnparkPs) -> None:
        self._action("unpark")

    def _do_FillPs(self, c: C.FillPs) -> None:
        self.num_shards += 1
        self._action("fill", **self._moved(c.moves))

    def _do_KillPs(self, c: C.KillPs) -> None:
        pass

    def _do_PsNoticed(self, c: C.PsNoticed) -> None:
        pass

    def _do_Restore(self, c: C.Restore) -> None:
        self._back_to(c.checkpoint)

    def _back_to(self, checkpoint: int | None) -> None:
        """Training state goes back to ``checkpoint`` (None: where the run started): the steps since are lost."""
        assert checkpoint is None or checkpoint in self.stored, "a restore names a checkpoint the run stored"
        back = checkpoint if checkpoint is not None else self.start_step
        self.steps_lost += self.step - back
        self.step = back
        self._action("restore", step=back)

    def _do_Regroup(self, c: C.Regroup) -> None:
        """An all-reduce group re-formed: from a member's state (training goes on at the step), or from the
        checkpoint the controller names when no member holds the state."""
        self.regroups.append(c)
        if c.root is not None:
            self._action("regroup")
        else:
            self._back_to(c.checkpoint)

    def _do_ChangePlacement(self, c: C.ChangePlacement) -> None:
        self.num_shards += len(c.new_keys)
        self._action("placement", migrations=((c.decisions, 1000 * len(c.decisions), self.action_wall_s),))

    def _do_Balance(self, c: C.Balance) -> None:
        self.feed(E.ShardLoads(wall=self.wall, global_step=c.step, balance=True))

    def _do_Note(self, c: C.Note) -> None:
        pass

    def _do_Probe(self, c: C.Probe) -> None:
        self.probes.append(self.wall)
        if self.frozen_shard:  # the probe finds it frozen and ends it: the pushes waiting on it fail
            self.frozen_shard = False
            for w in self.workers.values():
                if w.training:
                    w.training = False
                    self.feed(E.ChunkFailed(wall=self.wall, worker_id=w.worker_id, shard_lost=True))
            self.feed(E.ShardLost(wall=self.wall))
            self.feed(E.ProbeDone(wall=self.wall, ok=False))
        elif self.stuck:
            self.feed(E.ClusterLost(wall=self.wall, message="the Ray node this run uses was marked dead"))
        else:
            self.feed(E.ProbeDone(wall=self.wall))

    def _do_EndRun(self, c: C.EndRun) -> None:
        self.ended = c

    # -- reading ----------------------------------------------------------------------------------------
    def of(self, kind: type) -> list[Any]:
        return [c for c in self.commands if isinstance(c, kind)]

    def at(self, kind: type) -> list[tuple[int, Any]]:
        return [(step, c) for _, step, c in self.log if isinstance(c, kind)]
