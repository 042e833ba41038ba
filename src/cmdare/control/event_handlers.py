"""How events update a run's records and its time: the event half of :class:`~cmdare.control.controller.RunController`.

Each ``_on_<Event>`` method takes one event type of :mod:`cmdare.control.run_events`; the controller then
settles the run (its decision pass). Time: every event brings wall time; cloud time comes with the event
(the simulator, a real cluster) or, in emulation, advances with the training progress it reports and jumps
ahead when the emulated cluster can only wait for a cloud event.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cmdare.control.kinds import DutyKind, ShardAction
from cmdare.control.run_commands import CloseSpares, Regroup, Restore
from cmdare.control.run_events import (
    ActionDone,
    AllStopped,
    CheckpointFailed,
    CheckpointStored,
    ChunkDone,
    ChunkFailed,
    ClusterLost,
    CodeFailed,
    DutyDone,
    Event,
    ProbeDone,
    ServerStarting,
    SpareLost,
    SpareUp,
    StopRequested,
    Tick,
    WorkerAtRisk,
    WorkerNotice,
    WorkerStartFailed,
    WorkerStopped,
    WorkerUp,
)
from cmdare.control.run_state import Finishing

if TYPE_CHECKING:
    from cmdare.control.divergence import DivergenceWatch
    from cmdare.control.duties import DutySchedule
    from cmdare.control.emulated_clock import EmulatedClock
    from cmdare.control.liveness import Liveness
    from cmdare.control.run_commands import Command
    from cmdare.control.run_config import RunConfig
    from cmdare.control.run_state import Phase
    from cmdare.control.spares import WarmSpares
    from cmdare.control.topology import Topology
    from cmdare.control.worker_control import WorkerControl

__all__ = ["RunEventHandlers"]


class RunEventHandlers:
    """The controller's event handlers and time keeping (a base of ``RunController``, never used alone)."""

    config: RunConfig
    clock: EmulatedClock | None
    workers: WorkerControl
    topology: Topology
    spares: WarmSpares
    out: list[Command]
    duties: DutySchedule
    liveness: Liveness
    phase: Phase
    action: Command | None
    step: float
    fence: int
    now: float
    wall: float
    rollbacks: int
    divergence: DivergenceWatch
    target: int
    stop_wall: float | None
    stop_why: str
    started: bool

    if TYPE_CHECKING:  # the controller's, which this is a base of (declared for type checkers, never stubbed)
        def rate(self) -> float: ...

        def _end(self, status: str, message: str = "") -> None: ...

        def _resume_hint(self) -> str: ...

        def _run_duty(self, duty: Any, rec: Any) -> None: ...

    # -- time ----------------------------------------------------------------------------------------
    def _time(self, event: Event) -> None:
        self.wall = self.workers.wall = event.wall
        if self.clock is None:
            if event.now is not None:
                self.now = max(self.now, float(event.now))
        else:
            step = getattr(event, "global_step", None)
            if step is not None and step > self.clock.step:
                self.now = self.clock.advance(step, self.rate())
            elif isinstance(event, Tick):
                at = self._jump_target()
                if at is not None:
                    self.now = self.clock.jump(at)
        self.topology.at(self.now, self.wall)

    def _jump_target(self) -> float | None:
        """Emulation: when the emulated cluster cannot train until a cloud time (no member left until a
        replacement is ready; the last shard parked, or a dead one, until its replacement is ready), cloud
        time jumps to the next cloud event. None while training could go on, or while what it waits for is
        real (a process starting, an action under way)."""
        if self.action is not None:
            return None
        ready: list[float | None]
        if self.rate() == 0:
            ready = [r.ready_at for r in self.workers.waiting.values()]
        elif self.topology.blocked(self.now):
            ready = self.topology.ready_times()
        else:
            return None
        future = [t for t in ready if t is not None and t > self.now]
        if not future:
            return None
        return min(min(future), self._next_cloud_time())

    def _next_cloud_time(self) -> float:
        """The next cloud time something falls due (what is due by now was decided already; inf: nothing)."""
        return min(self.workers.next_time(self.now), self.topology.next_time(self.now))

    def _progress(self, step: float) -> None:
        if step > self.step:
            self.step = step
            self.liveness.progressed(self.wall)

    # -- events --------------------------------------------------------------------------------------
    def _on_Tick(self, ev: Tick) -> None:
        if ev.global_step is not None:
            self._progress(ev.global_step)

    def _on_ChunkDone(self, ev: ChunkDone) -> None:
        self._progress(ev.global_step)
        self.topology.chunk_done(ev)
        why = self.divergence.training(ev.loss, ev.params_finite)
        if why is not None:
            self._diverged(ev.worker_id, why, ev.diverged_at if ev.diverged_at is not None else int(ev.global_step))
            return
        rec = self.workers.rec(ev.worker_id)
        if rec is not None and rec.active and ev.steps:
            info = self.workers.kernel.state.worker(ev.worker_id)
            if info is not None and info.trained_at is None:
                self.workers.trained(ev.worker_id, self.now)

    def _diverged(self, worker_id: int, why: str, step: int) -> None:
        """Training diverged (:mod:`cmdare.control.divergence`: ``why``, seen by worker ``worker_id`` at ``step``):
        roll every shard back to the newest stored checkpoint (with a lower learning rate) while rollbacks are
        left, else end the run. Nothing non-finite is ever stored."""
        if self.topology.rolling_back:
            return  # the rollback is on its way
        what = f"worker {worker_id}'s {why} at step {step}"
        if self.rollbacks >= self.config.max_rollbacks or isinstance(self.phase, Finishing):
            tried = f" again after {self.rollbacks} rollback(s)" if self.rollbacks else ""
            self._end("failed", f"training diverged{tried}: {what} (try a lower --lr"
                                f"{'' if self.config.max_rollbacks else ', or --on-diverge rollback'}); nothing "
                                f"non-finite is stored; {self._resume_hint()}")
            return
        self.rollbacks += 1
        self.divergence.why = what
        self.topology.roll_back("diverged")

    def rollback_details(self) -> dict[str, Any]:
        """The rollback under way: its number, how many are allowed, the learning-rate factor after it."""
        return {"reason": "diverged", "rollback": self.rollbacks, "max_rollbacks": self.config.max_rollbacks,
                "lr_scale": self.config.rollback_lr_scale ** self.rollbacks, "why": self.divergence.why}

    def _on_WorkerStopped(self, ev: WorkerStopped) -> None:
        self._progress(ev.global_step)
        self.workers.stopped(ev.worker_id)

    def _on_AllStopped(self, ev: AllStopped) -> None:
        self._progress(ev.global_step)
        self.workers.training_ids.clear()

    def _on_WorkerNotice(self, ev: WorkerNotice) -> None:
        rec = self.workers.notice(ev.worker_id, self.now)
        if rec is None:
            return
        if ev.worker_id == self.workers.chief and self.config.checkpoint_every and rec.up:
            duty = self.duties.add(DutyKind.CHECKPOINT, int(self.step), reason="notice")
            self._run_duty(duty, rec)
        else:
            self.workers.release(ev.worker_id, self.now)
            self._after_loss()

    def _on_WorkerAtRisk(self, ev: WorkerAtRisk) -> None:
        if ev.worker_id in self.workers.active:  # a spare at once: the notice, if it comes, finds one up
            self.workers.spares.noticed(self.now, f"worker {ev.worker_id}'s server is at risk ({ev.provider} "
                                                  "rebalance recommendation)")

    def _on_ChunkFailed(self, ev: ChunkFailed) -> None:
        self.workers.stopped(ev.worker_id)
        if not ev.shard_lost and self.workers.lose(ev.worker_id, self.now, "revoked"):
            self._after_loss(ev.worker_id)

    def _on_CodeFailed(self, ev: CodeFailed) -> None:
        self.workers.stopped(ev.worker_id)
        self._end("failed", f"{ev.error}; {self._resume_hint()}")

    def _on_ServerStarting(self, ev: ServerStarting) -> None:
        if ev.worker_id is not None:
            self.workers.server_starting(ev.worker_id, ev.startup_s, self.now)
        elif ev.key is not None:
            self.topology.server_starting(ev.key, ev.startup_s, self.now)
        elif ev.spare is not None:
            self.spares.starting(ev.spare, ev.startup_s, self.now)

    def _on_SpareUp(self, ev: SpareUp) -> None:
        self.spares.up(ev.key, self.now)

    def _on_SpareLost(self, ev: SpareLost) -> None:
        was_closed = self.spares.closed
        self.spares.lost(ev.key, self.now)
        if self.spares.closed and not was_closed:
            failed = self.spares.failed_starts
            self.out.append(CloseSpares(failed, why=f"{failed} warm spares in a row died before they were up: "
                                                    "no more are asked for"))

    def _on_WorkerUp(self, ev: WorkerUp) -> None:
        self.workers.process_up(ev.worker_id, self.now)

    def _on_WorkerStartFailed(self, ev: WorkerStartFailed) -> None:
        if ev.deterministic:
            self._end("failed", f"worker {ev.worker_id} could not start: {ev.error}")
            return
        if self.workers.start_failed(ev.worker_id, self.now, ev.error):
            self._after_loss(ev.worker_id)

    def _on_DutyDone(self, ev: DutyDone) -> None:
        rec = self.workers.rec(ev.worker_id)
        if rec is not None and rec.duties:
            rec.duties -= 1
        duty = self.duties.finished(ev.kind, ev.step, ev.ok, ev.worker_id)
        if ev.ok and ev.kind == DutyKind.EVAL and (why := self.divergence.test(ev.loss)) is not None:
            self._diverged(ev.worker_id, why, ev.step)  # a run never ends finished on an exploded model
            return
        if ev.ok:
            if ev.kind == DutyKind.CHECKPOINT and not self.config.virtual_duties:
                self.duties.upload_began(ev.step, self.wall)  # a restore waits for it: it may be the newest
            if duty is not None and duty.reason == "notice":
                self.workers.release(ev.worker_id, self.now)
                self._after_loss(ev.worker_id)
            return
        if ev.shard_lost:
            if isinstance(self.phase, Finishing):
                self._end("failed", f"a parameter shard died during the final {ev.kind}; the latest stored "
                                    f"checkpoint is kept ({self._resume_hint()})")
                return
            self.topology.state_lost()
        elif self.workers.lose(ev.worker_id, self.now, "revoked"):
            self._after_loss(ev.worker_id)

    def _on_CheckpointStored(self, ev: CheckpointStored) -> None:
        self.duties.stored(ev.step)
        self.failed_uploads_in_a_row = 0

    def _on_CheckpointFailed(self, ev: CheckpointFailed) -> None:
        self.duties.upload_failed(ev.step)
        self.failed_uploads_in_a_row += 1
        self.last_upload_error = ev.error
        if self.failed_uploads_in_a_row >= self.config.max_failed_uploads and not isinstance(self.phase, Finishing):
            self._end("failed", f"{self.failed_uploads_in_a_row} checkpoint uploads in a row failed (the last, of step "
                                f"{ev.step}: {ev.error}); training stopped rather than go on with nothing stored; "
                                f"{self._resume_hint()}")

    def _on_ActionDone(self, ev: ActionDone) -> None:
        command, self.action = self.action, None
        self.liveness.progressed(self.wall)
        if command is None:
            return
        self.topology.action_done(command, ev)
        if ev.ok and ev.action == ShardAction.RESTORE and ev.step is not None:
            if isinstance(command, Restore | Regroup) and command.reason == "diverged":
                self.workers.damp_lr(self.config.rollback_lr_scale, self.now)
                self.divergence.rolled_back()
            self.step = ev.step
            if self.clock is not None:
                self.clock.rebase(ev.step)
            self.duties.restart(ev.step)
            self.fence = ev.step

    def _on_StopRequested(self, ev: StopRequested) -> None:
        """Stop at the next step boundary: training goes on to the nearest whole step, then the checkpoint of that
        step is stored (no evaluation: a stop is bounded in time) and the run ends ``interrupted``."""
        if self.stop_wall is not None or isinstance(self.phase, Finishing):
            return  # asked already, or the run is ending anyway
        self.stop_wall, self.stop_why = self.wall, ev.why
        if not self.started:
            self._end("interrupted", f"{ev.why} before training started; {self._resume_hint()}")
            return
        self.target = min(self.target, max(int(math.ceil(self.step)), 1))

    def _on_ProbeDone(self, ev: ProbeDone) -> None:
        self.liveness.answered(self.wall)

    def _on_ClusterLost(self, ev: ClusterLost) -> None:
        self._end("failed", f"{ev.message}; {self._resume_hint()}")

    def _after_loss(self, worker_id: int | None = None) -> None:
        """A worker left: its duties go to the next chief; the topology hears at once (a synchronous round
        shrinks)."""
        if worker_id is not None:
            self.duties.chief_lost(worker_id)
        self.topology.membership(self.workers)
