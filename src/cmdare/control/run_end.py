"""How a run ends: the final duties, the final checkpoint made durable, and the failures that end it early.

A base of :class:`~cmdare.control.controller.RunController` (its other half is
:mod:`cmdare.control.event_handlers`). A run reaching its target step runs the final evaluation and
checkpoint on the chief, waits until that checkpoint is stored, and ends ``finished``; a final checkpoint
that cannot be stored (or a chief that is gone with no one left to take it) ends the run ``failed``, with
the step of the last stored checkpoint and where it is: a run never reports success over lost work.
Deadlines on real waits (:class:`~cmdare.control.liveness.Liveness`) end it failed too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cmdare.control.kinds import DutyKind
from cmdare.control.run_commands import CancelWorker, EndRun
from cmdare.control.run_state import Ended, Finishing, RunState

if TYPE_CHECKING:
    from cmdare.control.duties import DutySchedule
    from cmdare.control.liveness import Liveness
    from cmdare.control.run_commands import Command
    from cmdare.control.run_config import RunConfig
    from cmdare.control.run_state import Phase
    from cmdare.control.worker_control import WorkerControl

__all__ = ["RunEnding"]


class RunEnding:
    """The end of a run (a base of ``RunController``, never used alone)."""

    config: RunConfig
    workers: WorkerControl
    duties: DutySchedule
    liveness: Liveness
    phase: Phase
    action: Command | None
    out: list[Command]
    step: float
    wall: float
    last_upload_error: str
    final_upload_since: float | None
    stop_wall: float | None
    stop_why: str

    if TYPE_CHECKING:  # the controller's, which this is a base of (declared for type checkers, never stubbed)
        @property
        def ended(self) -> bool: ...

        def _to(self, state: RunState) -> None: ...

        def _quiesced(self) -> bool: ...

        def _start_duties(self) -> None: ...

    def _finishing(self) -> None:
        """The target step: the final evaluation and checkpoint on the chief, then the end."""
        if not isinstance(self.phase, Finishing):
            self.phase = Finishing(int(self.step))
            self._to(RunState.FINISHING)
            self.workers.replace_lost = False  # a worker lost now is not replaced: the run is over
            for rec in list(self.workers.waiting.values()):  # a replacement on its way is not needed now
                self.workers.waiting.pop(rec.worker_id)
                rec.gone = True
                self.out.append(CancelWorker(rec.worker_id, "cancelled", why="the run ends before it joined"))
            step = int(self.step)
            if not self.config.virtual_duties:
                if self.stop_wall is None:  # a requested stop stores its step and ends: no evaluation
                    self.duties.add(DutyKind.EVAL, step, final=True)
                if self.config.final_checkpoint:
                    self.duties.add(DutyKind.CHECKPOINT, step, final=True)
        if self.config.virtual_duties:
            self.duties.catch_up(self.step)
            self._end("finished")
            return
        if not self._quiesced():
            return
        self._start_duties()
        if not self.duties.pending:
            if self._final_checkpoint_stored():
                self._end(*self._final_status())
        elif self.workers.chief is None and not self.workers.active and not self.workers.waiting:
            done = "the training steps are done, but " if not self.config.final_checkpoint else ""
            self._end("failed" if self.config.final_checkpoint else "finished",
                      f"{done}no worker was left for the final evaluation and checkpoint; {self._resume_hint()}")

    def _final_status(self) -> tuple[str, str]:
        """How a run that reached its stop ends: ``finished`` at its target, or ``interrupted`` where a requested
        stop fell, naming the step stored and how to resume."""
        if self.stop_wall is None:
            return "finished", ""
        step = self.phase.step if isinstance(self.phase, Finishing) else int(self.step)
        stored = "" if self.config.final_checkpoint else " (no checkpoint: checkpoints are off)"
        return "interrupted", f"{self.stop_why} at step {step}{stored}; {self._resume_hint()}"

    def _final_checkpoint_stored(self) -> bool:
        """Whether the final checkpoint is durable (True where there is none to wait for); ends the run failed when
        its upload failed or did not end within ``stuck_after_s``."""
        step = self.phase.step if isinstance(self.phase, Finishing) else int(self.step)
        if not self.config.final_checkpoint or step in self.duties.checkpoints:
            return True
        if step in self.duties.failed:
            why = f"could not be stored ({self.last_upload_error})"
        elif self.final_upload_since is None or self.wall - self.final_upload_since < self.config.stuck_after_s:
            self.final_upload_since = self.wall if self.final_upload_since is None else self.final_upload_since
            return False  # its upload is under way
        else:
            why = f"was not stored within {self.config.stuck_after_s:g} s"
        self._end("failed", f"the final checkpoint (step {step}) {why}; {self._resume_hint()}")
        return False

    def _liveness(self) -> None:
        """Deadlines on real waits (:class:`~cmdare.control.liveness.Liveness`): fail, or probe the cluster."""
        busy = self.workers.training() or self.action is not None
        failure = self.liveness.failure(self.wall, busy, int(self.step))
        if failure is not None:
            self._end("failed", f"{failure}; {self._resume_hint()}")
        elif (probe := self.liveness.probe(self.wall)) is not None:
            self.out.append(probe)

    def _resume_hint(self) -> str:
        return self.config.resume_hint(self.duties.latest_checkpoint())

    def _end(self, status: str, message: str = "") -> None:
        if self.ended:
            return
        self._to({"finished": RunState.FINISHED, "interrupted": RunState.INTERRUPTED}.get(status, RunState.FAILED))
        self.phase = Ended(status, message)
        self.out.append(EndRun(status, message, why=message or f"the run is {status}"))
