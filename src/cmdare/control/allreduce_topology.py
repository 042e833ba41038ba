"""Training as an elastic all-reduce group, as the fleet's :class:`~cmdare.control.topology.Topology`.

Every member holds the whole model and optimizer; the members average their gradients each step, so they train
in lockstep rounds of all of them. There are no servers of the topology's own. What the topology decides is the
group: whenever the members that are up differ from the group's (a loss, a notice's departure, a replacement's
process up), training holds and, once every member stopped, the group is re-formed at a new epoch
(:class:`~cmdare.control.run_commands.Regroup`). The members' state is healed from the member that completed the
most steps among those of the old group (a member can complete a collective its peer failed); a group with none
of the old members (every member lost at once) goes back to the newest stored checkpoint. A loss costs the step
in flight; nothing is restored from storage while one member of the old group lives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cmdare.control.kinds import ShardAction
from cmdare.control.run_commands import Regroup, SetRoundSize
from cmdare.control.topology import Quiesce

if TYPE_CHECKING:
    from cmdare.cloud.servers import ServerSpec
    from cmdare.control.duties import DutySchedule
    from cmdare.control.run_commands import Command
    from cmdare.control.run_config import RunConfig
    from cmdare.control.run_events import ActionDone, ChunkDone, Event, GroupBroken
    from cmdare.control.worker_control import WorkerControl

__all__ = ["AllReduceTopology"]

_STATE_GONE = "no member of the last group is left: its state is gone"


class AllReduceTopology:
    """All-reduce training: an elastic group of the members that are up, re-formed on every change."""

    lockstep = True
    failure: str | None = None

    def __init__(self, config: RunConfig, out: list[Command], duties: DutySchedule | None = None):
        self.config, self.out, self.duties = config, out, duties
        self.group: tuple[int, ...] = ()  # the members of the group formed last (rank order)
        self.epoch = 0  # the group's epoch (0: none formed yet)
        self.steps: dict[int, float] = {}  # member -> the global step its last chunk ended at
        self.round_size = config.workers
        self.restore_reason: str | None = None  # the members' state must come from the checkpoint (why)
        self.fresh = True  # no group has trained yet: the first wave's state is the run's start
        self.broken: str | None = None  # the group's collective failed with every member answering (why)
        self.now = 0.0

    # -- no servers of its own ---------------------------------------------------------------------
    def start(self, spec: ServerSpec, count: int, now: float, step: int) -> None:
        self.now = now

    def snapshot(self) -> dict[str, Any] | None:
        return None

    def resume(self, saved: dict[str, Any] | None) -> None:
        """A resumed run's first group starts from the checkpoint every member loaded."""

    def at(self, now: float, wall: float) -> None:
        self.now = now

    def rate(self, workers: WorkerControl) -> float:
        """The slowest member's speed: every step waits for it."""
        return workers.rate(True)

    def candidates(self) -> list:
        return []

    def tick(self, now: float, picked: Sequence[int], due_by: float) -> None:
        return None

    def expire(self, wall: float) -> None:
        return None

    def next_time(self, now: float) -> float:
        return float("inf")

    def next_wall(self) -> float:
        return float("inf")

    def unanswered(self) -> bool:
        return False

    def ready_times(self) -> list[float | None]:
        return []

    def server_starting(self, key: int, startup_s: float | None, now: float) -> None:
        return None

    # -- training ----------------------------------------------------------------------------------
    def blocked(self, now: float) -> bool:
        """No duty while the group's state must come from storage: a member holding it is gone (a newcomer's fresh
        model is no checkpoint)."""
        return self.restore_reason is not None

    @property
    def restoring(self) -> bool:
        return self.restore_reason is not None

    @staticmethod
    def _members(workers: WorkerControl) -> tuple[int, ...]:
        """The members a group is formed of now: those whose process is up and that are not leaving."""
        return tuple(sorted(wid for wid, r in workers.active.items() if r.up and not r.leaving))

    def quiesce(self, now: float, workers: WorkerControl, quiesced: bool) -> Quiesce | None:
        """The members that are up differ from the group's (or its state must come from storage): hold, and once
        every member stopped, re-form. Before the first group, only once the whole first wave is up."""
        members = self._members(workers)
        if not members:  # none up: hold (not finish) while the group's state is to come back from storage
            return Quiesce("regroup") if self.restoring and self.group else None
        if not self.group and any(not r.up and r.replaces is None for r in workers.active.values()):
            return None  # the first wave is still coming up
        if members == self.group and self.restore_reason is None and self.broken is None:
            return None
        if not quiesced:
            return Quiesce("regroup")
        return Quiesce("regroup", action=self._regroup(members))

    def _regroup(self, members: tuple[int, ...]) -> Regroup:
        old = [m for m in members if m in self.group]
        epoch = self.epoch + 1
        if self.restore_reason is not None or (not old and not self.fresh):
            why = self.restore_reason or _STATE_GONE
            checkpoint = self.duties.latest_checkpoint() if self.duties is not None else None
            back = f"the checkpoint of step {checkpoint}" if checkpoint is not None else \
                "the state the run started from"
            reason = "diverged" if self.restore_reason == "diverged" else "lost"
            return Regroup(epoch, members, None, checkpoint, reason, why=f"{why}: every member loads {back}")
        if not old:  # the first group of the run: every member built the same state
            return Regroup(epoch, members, members[0], why=f"the first group: {len(members)} members")
        root = max(old, key=lambda m: (self.steps.get(m, 0.0), -members.index(m)))
        joined = [m for m in members if m not in self.group]
        left = [m for m in self.group if m not in members]
        change = ", ".join(part for part in (f"{len(left)} left" if left else "",
                                             f"{len(joined)} joined" if joined else "") if part) or \
            f"its collective failed: {self.broken}"
        return Regroup(epoch, members, root, why=f"the group changed ({change}): {len(members)} members, state from "
                                                 f"worker {root}")

    def action_done(self, command: Command, ev: ActionDone) -> None:
        """The group of the command is formed (else the controller decides again on what changed)."""
        if not isinstance(command, Regroup) or not ev.ok or ev.action not in (ShardAction.REGROUP,
                                                                              ShardAction.RESTORE):
            return
        self.group, self.epoch = command.members, command.epoch
        self.restore_reason = None
        self.broken = None
        self.fresh = False
        step = float(ev.step) if ev.step is not None else max(self.steps.values(), default=0.0)
        self.steps = {m: step for m in command.members}
        if len(command.members) != self.round_size:
            self.round_size = len(command.members)
            self.out.append(SetRoundSize(self.round_size, why=f"the group of epoch {self.epoch}"))

    def membership(self, workers: WorkerControl) -> None:
        """A member lost: the round it was in cannot complete; the survivors stop at once (their collective fails
        on its own on a real cluster; a driver that waits for a round is told its new size)."""
        members = self._members(workers)
        if self.group and self.restore_reason is None and not any(m in workers.active for m in self.group):
            self.restore_reason = _STATE_GONE
        n = sum(1 for m in self.group if m in members)  # before the first group there is no round to shrink
        if 0 < n < self.round_size:
            self.round_size = n
            self.out.append(SetRoundSize(n, why=f"{n} members left in the all-reduce group"))

    def balance(self, step: int) -> Command | None:
        return None

    def chunk_done(self, ev: ChunkDone) -> None:
        """Where each member's state is: the heal root is the member of the old group furthest on."""
        self.steps[ev.worker_id] = float(ev.global_step)

    def roll_back(self, reason: str) -> None:
        """Every member goes back to the newest stored checkpoint (training diverged)."""
        self.restore_reason = reason

    @property
    def rolling_back(self) -> bool:
        return self.restore_reason == "diverged"

    def state_lost(self) -> None:
        self.restore_reason = "the group's state was lost"

    def _on_GroupBroken(self, ev: GroupBroken) -> None:
        """The group's collective failed with every member answering: form it again (the same members)."""
        if ev.worker_id in self.group:
            self.broken = ev.detail or "a collective failed"

    # -- events of parameter servers: an all-reduce run has none ------------------------------------
    def _no_servers(self, ev: Event) -> None:
        """An event about a PS server or shard, which an all-reduce run does not have: nothing to do."""

    _on_PsNotice = _on_PsUp = _on_PsStartFailed = _on_ShardLost = _on_PlacementRequested = _on_ShardLoads = \
        _no_servers
