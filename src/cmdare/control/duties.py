"""The chief's duties: checkpoints and evaluations at the steps the schedule names, never skipped.

A duty falls due at each multiple of its interval (counted as absolute steps, so ``--checkpoint-every
50`` means steps 50, 100, 150 ...; after the shards roll back to a checkpoint the multiples after that
step). The controller stops training at the next due step (a fence), so the duty sees the parameters of
exactly that step. A duty cut short (the chief lost during it) stays due and is run again, for the same
step, by the next chief. Checkpoints are counted durable only once stored (:meth:`DutySchedule.stored`).

In the simulator duties are *virtual* (:meth:`DutySchedule.catch_up`): each due checkpoint is taken and
stored the moment its step is passed, and the simulator charges its cost in its speed model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cmdare.control.kinds import DutyKind

__all__ = ["DUTY_KINDS", "DutySchedule", "PendingDuty"]

#: The chief's duties, in the order they run when both fall due at one step.
DUTY_KINDS = tuple(DutyKind)


@dataclass
class PendingDuty:
    """A duty due at ``step`` and not done yet (``running``: a chief is on it)."""

    kind: DutyKind
    step: int
    final: bool = False
    reason: str = "schedule"
    running: int | None = None  # the chief's worker id while it runs
    tries: int = 0


@dataclass
class DutySchedule:
    """When the chief's duties fall due, which are pending, and which checkpoints are durable."""

    checkpoint_every: int
    eval_every: int
    steps: int
    next: dict[str, int] = field(default_factory=dict)
    pending: list[PendingDuty] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # stored checkpoint steps, in order stored
    failed: list[int] = field(default_factory=list)  # checkpoint steps whose upload failed
    uploading: dict[int, float] = field(default_factory=dict)  # checkpoint step -> wall time its upload began

    def every(self, kind: DutyKind) -> int:
        return self.checkpoint_every if kind == DutyKind.CHECKPOINT else self.eval_every

    def restart(self, step: int) -> None:
        """Duties fall due at the multiples after ``step`` (at the start; after a rollback). Pending periodic
        duties of steps after ``step`` are dropped (their parameters are gone)."""
        self.next = {kind: _next_multiple(step, self.every(kind)) for kind in DUTY_KINDS}
        self.pending = [d for d in self.pending if d.step <= step or d.reason != "schedule"]

    def snapshot(self) -> list[list]:
        """The duties due and not begun (``[kind, step, reason]``; not the final ones), saved with a checkpoint: a
        resumed run does them first."""
        return [[str(d.kind), d.step, d.reason] for d in self.waiting() if not d.final]

    def resume(self, saved: list[list]) -> None:
        """After :meth:`restart`: the duties a saved run had due and had not begun (:meth:`snapshot`) are due."""
        for kind, step, reason in saved:
            self.add(DutyKind(kind), int(step), reason=reason)

    def next_step(self) -> int | None:
        """The next step a periodic duty falls due at (None: none before the last step)."""
        steps = [s for s in self.next.values() if s and s < self.steps]
        return min(steps, default=None)

    def due(self, step: int) -> list[PendingDuty]:
        """Queue the periodic duties due by ``step`` (one per kind, for the step it fell due at) and
        return every pending duty not running, checkpoints first."""
        for kind in DUTY_KINDS:
            at = self.next.get(kind, 0)
            if at and at <= step < self.steps:
                self.next[kind] = _next_multiple(step, self.every(kind))
                if not any(d.kind == kind and d.step == at for d in self.pending):
                    self.pending.append(PendingDuty(kind, at))
        return self.waiting()

    def waiting(self) -> list[PendingDuty]:
        """Pending duties no chief is running, checkpoints first, then by step."""
        return sorted((d for d in self.pending if d.running is None),
                      key=lambda d: (DUTY_KINDS.index(d.kind), d.step))

    def add(self, kind: DutyKind, step: int, final: bool = False, reason: str = "schedule") -> PendingDuty:
        """Queue a duty outside the schedule (the final ones; a checkpoint on the chief's notice)."""
        duty = next((d for d in self.pending if d.kind == kind and d.step == step), None)
        if duty is None:
            duty = PendingDuty(kind, step, final, reason)
            self.pending.append(duty)
        duty.final = duty.final or final
        return duty

    def started(self, duty: PendingDuty, chief: int) -> None:
        duty.running, duty.tries = chief, duty.tries + 1

    def finished(self, kind: DutyKind, step: int, ok: bool, chief: int | None = None) -> PendingDuty | None:
        """A duty ended on ``chief``: done (removed) or cut short (due again, for the same step). The end of a
        run the duty was since given to another chief for changes nothing."""
        duty = next((d for d in self.pending if d.kind == kind and d.step == step), None)
        if duty is None or (chief is not None and duty.running not in (None, chief)):
            return None
        if ok:
            self.pending.remove(duty)
        else:
            duty.running = None
        return duty

    def chief_lost(self, chief: int) -> list[PendingDuty]:
        """The chief died: the duties it was running are due again (for the next chief)."""
        out = [d for d in self.pending if d.running == chief]
        for d in out:
            d.running = None
        return out

    def running(self) -> list[PendingDuty]:
        return [d for d in self.pending if d.running is not None]

    def upload_began(self, step: int, wall: float) -> None:
        """The checkpoint of ``step`` was taken; its upload is under way (unless it already ended)."""
        if step not in self.checkpoints and step not in self.failed:
            self.uploading.setdefault(step, wall)

    def stored(self, step: int) -> None:
        """The checkpoint of ``step`` is durable."""
        self.checkpoints.append(step)
        self.uploading.pop(step, None)

    def upload_failed(self, step: int) -> None:
        self.failed.append(step)
        self.uploading.pop(step, None)

    def uploads_since(self, wall: float) -> bool:
        """Whether a checkpoint upload that began at or after ``wall`` is still under way."""
        return any(began >= wall for began in self.uploading.values())

    def latest_checkpoint(self) -> int | None:
        """The step of the newest durable checkpoint (None: none yet)."""
        return self.checkpoints[-1] if self.checkpoints else None

    def catch_up(self, step: float) -> None:
        """Virtual duties (the simulator): every periodic checkpoint due by ``step`` is taken and stored."""
        every = self.checkpoint_every
        at = self.next.get(DutyKind.CHECKPOINT, 0)
        if every and at and at <= step:
            last = min(int(step) // every * every, (self.steps - 1) // every * every)
            if last >= at:
                self.checkpoints.append(last)
            self.next[DutyKind.CHECKPOINT] = last + every if last >= at else at
        eval_at = self.next.get(DutyKind.EVAL, 0)
        if self.eval_every and eval_at and eval_at <= step:
            self.next[DutyKind.EVAL] = _next_multiple(int(step), self.eval_every)


def _next_multiple(step: float, every: int) -> int:
    return (int(step) // every + 1) * every if every else 0
