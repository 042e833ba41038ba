"""What a run saves with each checkpoint and how a resumed run goes on from it.

A base of :class:`~cmdare.control.controller.RunController`. The controller's state is stored with each checkpoint
(``StartDuty.state``, JSON) and restored by ``--resume``: the rollbacks and learning-rate damping, the duties due
and not begun, and in emulation the whole emulated fleet, so a run killed after a checkpoint and resumed makes the
decisions of the run that never stopped. A fleet that is not the resumed run's (other workers or revocations) or
does not read (an edited checkpoint) gives way to a new one, with a note.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cmdare.control.run_commands import Note

if TYPE_CHECKING:
    from cmdare.cloud.servers import ServerSpec
    from cmdare.control.duties import DutySchedule
    from cmdare.control.emulated_clock import EmulatedClock
    from cmdare.control.kernel import MembershipKernel
    from cmdare.control.run_commands import Command
    from cmdare.control.spares import WarmSpares
    from cmdare.control.topology import Topology
    from cmdare.control.worker_control import WorkerControl

__all__ = ["SavedRun"]


class SavedRun:
    """The saved state of a run and its resumption (a base of ``RunController``, never used alone)."""

    clock: EmulatedClock | None
    workers: WorkerControl
    spares: WarmSpares
    duties: DutySchedule
    topology: Topology
    out: list[Command]
    now: float
    rollbacks: int
    _saved: dict[str, Any]
    _wave: list[dict]

    if TYPE_CHECKING:
        @property
        def kernel(self) -> MembershipKernel: ...

    def saved_state(self) -> dict[str, Any]:
        """What a run resumed from a checkpoint needs to decide as this one would from there, as JSON-able values;
        stored with each checkpoint (``StartDuty.state``):

        * the rollbacks taken after divergences (so ``--on-diverge rollback:N`` counts over the whole run) and the
          learning-rate damping they left; the duties due and not begun;
        * in emulation, the emulated fleet: cloud time, every worker, replacement on its way and spare with its
          server, ready time and drawn lifetime, the PS servers (when the shards are at rest), the chief, and the
          revocation source's draws so far. Emulated time advances only with training, so none passes while a run
          is stopped: the resumed run goes on with the same fleet. (A real cluster's servers are new on resume.)
        """
        state: dict[str, Any] = {"rollbacks": self.rollbacks, "lr_damping": self.kernel.lr_damping,
                                 "duties": self.duties.snapshot()}
        if self.clock is not None:
            state["fleet"] = {"step": self.clock.step, "cloud_time": self.clock.time, "wave": self._wave,
                              "source": self.kernel.revocations.name,
                              "workers": self.workers.snapshot(), "spares": self.spares.snapshot(),
                              "topology": self.topology.snapshot()}
        return state

    def restore_state(self, state: Mapping[str, Any] | None) -> None:
        """Before :meth:`start`: go on from a checkpoint's :meth:`saved_state` (None or empty: a fresh run's)."""
        self._saved = dict(state or {})
        if state:
            self.rollbacks = int(state.get("rollbacks", 0))
            self.kernel.lr_damping = float(state.get("lr_damping", 1.0))

    def _resume_fleet(self, ps_spec: ServerSpec, num_ps: int, step: int, wall: float, up: bool) -> bool:
        """In :meth:`start`: the saved run's emulated fleet goes on, at its cloud time; False (nothing done) where
        there is none to go on with."""
        fleet = self._saved.get("fleet") if self.clock is not None else None
        if not fleet:
            return False
        if (why := self._foreign_fleet(fleet, ps_spec, num_ps, step, wall, up)) is not None:
            self.out.append(Note("new_fleet", {"step": step, "reason": why},
                                 why=f"{why}: the resumed run starts a new emulated fleet"))
            return False
        self._restore_fleet(fleet, ps_spec, num_ps, step, wall, up)
        return True

    def _restore_fleet(self, fleet: Mapping[str, Any], ps_spec: ServerSpec, num_ps: int, step: int, wall: float,
                       up: bool) -> None:
        assert self.clock is not None
        self.now = self.clock.jump(fleet["cloud_time"])
        self.topology.at(self.now, wall)
        self.topology.start(ps_spec, num_ps, self.now, step)
        self.topology.resume(fleet["topology"])
        self.workers.resume(fleet["workers"], self.now, wall, up)
        self.spares.resume(fleet["spares"])

    def _foreign_fleet(self, fleet: Mapping[str, Any], ps_spec: ServerSpec, num_ps: int, step: int, wall: float,
                       up: bool) -> str | None:
        """Why the saved emulated fleet cannot go on (None: it can): other workers, revocations or start step, or
        a saved state that does not read (an edited or foreign checkpoint), found by resuming a copy of this
        controller, so a failure leaves nothing half-restored."""
        unreadable = (KeyError, IndexError, TypeError, ValueError, AttributeError)
        try:
            if (fleet["step"], fleet["wave"], fleet["source"]) != (step, self._wave, self.kernel.revocations.name):
                return "the resumed run's workers or revocations are not the saved run's"
            try:
                trial = copy.deepcopy(self)
            except (TypeError, copy.Error):  # a part that does not copy (a placement script's process): no trial
                return None
            trial._restore_fleet(fleet, ps_spec, num_ps, step, wall, up)
        except unreadable as err:
            return f"the checkpoint's saved fleet does not read ({type(err).__name__}: {err})"
        return None
