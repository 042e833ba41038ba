"""Training through parameter-server shards, as the fleet's :class:`~cmdare.control.topology.Topology`.

The shards' servers, their spares and the actions on quiesced shards (restore, evacuate, park, unpark, fill,
placement changes) are :class:`~cmdare.control.shard_control.ShardControl`'s; this adds what a parameter server
means for the rest of the run: asynchronous members add their speeds, synchronous rounds go at the slowest
member's and are sized to the workers they wait for, and PSLD's balancers are asked every ``balance_every`` steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cmdare.control.ps_servers import PsServerKernel
from cmdare.control.run_commands import Balance, Command, SetRoundSize
from cmdare.control.shard_control import ShardControl
from cmdare.control.topology import Quiesce

if TYPE_CHECKING:
    from cmdare.cloud.servers import ServerSpec
    from cmdare.control.run_config import RunConfig
    from cmdare.control.run_events import (
        ActionDone,
        PlacementRequested,
        PsNotice,
        PsStartFailed,
        PsUp,
        ShardLost,
    )
    from cmdare.control.worker_control import WorkerControl

__all__ = ["PsTopology"]


class PsTopology:
    """Parameter-server training: shards on servers of their own, asynchronous or in synchronous rounds."""

    def __init__(self, config: RunConfig, kernel: PsServerKernel, out: list[Command]):
        self.config, self.out = config, out
        self.shards = ShardControl(config, kernel, out)
        self.lockstep = config.sync
        self.round_size = config.workers  # workers a synchronous round waits for
        self.balance_at = 0  # the next balancing step (0: none)
        self.balancing = False  # a Balance is out, not answered yet
        self.now = 0.0

    @property
    def failure(self) -> str | None:
        return self.shards.failure

    def start(self, spec: ServerSpec, count: int, now: float, step: int) -> None:
        if self.config.balance_every:
            self.balance_at = (step // self.config.balance_every + 1) * self.config.balance_every
        self.shards.start(spec, count, now)

    def at(self, now: float, wall: float) -> None:
        self.now, self.shards.wall = now, wall

    def rate(self, workers: WorkerControl) -> float:
        """The members' speeds added up (asynchronous) or the slowest member's (synchronous rounds wait for it)."""
        return workers.rate(self.config.sync)

    # -- the PS servers --------------------------------------------------------------------------------
    def candidates(self) -> list:
        return self.shards.candidates()

    def tick(self, now: float, picked: Sequence[int], due_by: float) -> None:
        self.shards.tick(now, list(picked), due_by=due_by)

    def expire(self, wall: float) -> None:
        self.shards.expire(wall)

    def next_time(self, now: float) -> float:
        return self.shards.next_time(now)

    def next_wall(self) -> float:
        return self.shards.next_wall()

    def ready_times(self) -> list[float | None]:
        return [s.ready_at for s in self.shards.spares.values()]

    def server_starting(self, key: int, startup_s: float | None, now: float) -> None:
        self.shards.spare_starting(key, startup_s, now)

    def noticed(self, key: int) -> bool:
        """Whether PS server ``key`` has had its notice (a drain already heard)."""
        return key in self.shards.kernel.noticed

    def placement_waiting(self) -> bool:
        """Whether placement changes wait for quiesced shards."""
        return bool(self.shards.placements)

    # -- training ------------------------------------------------------------------------------------
    def blocked(self, now: float) -> bool:
        return self.shards.blocked(now)

    @property
    def restoring(self) -> bool:
        return bool(self.shards.dead) or self.shards.restore_reason is not None

    def quiesce(self, now: float, workers: WorkerControl, quiesced: bool) -> Quiesce | None:
        """An action on quiesced shards, a synchronous round that grows (a newcomer's first push must find it
        grown), or shards that cannot be used (dead, parked): training holds."""
        action = self.shards.next_action(now)
        grow = self.config.sync and workers.counted() > self.round_size
        if action is None and not grow and not self.shards.blocked(now):
            return None
        why = type(action).__name__ if action is not None else "round" if grow else "shards"
        if not quiesced:
            return Quiesce(why)
        if action is not None:
            return Quiesce(why, action=action)
        if grow:
            self.round_size = workers.counted()
            return Quiesce(why, then=SetRoundSize(self.round_size, wait=True,
                                                  why=f"a newcomer grows the synchronous round to {self.round_size}"))
        return Quiesce(why)

    def action_done(self, command: Command, ev: ActionDone) -> None:
        self.shards.done(command, ev.ok, self.now, ev.num_shards, ev.removed_keys)

    def membership(self, workers: WorkerControl) -> None:
        """A synchronous round shrinks at once to the workers left to count in it."""
        if not self.config.sync:  # only synchronous rounds have a size
            return
        n = max(1, workers.counted())
        if n < self.round_size:
            self.round_size = n
            self.out.append(SetRoundSize(n, why=f"{n} workers left to count in a synchronous round"))

    def balance(self, step: int) -> Command | None:
        """A balancing step passed: ask the balancers (their changes, if any, wait for quiesced shards)."""
        if not self.balance_at or step < self.balance_at or self.balancing:
            return None
        self.balance_at = (step // self.config.balance_every + 1) * self.config.balance_every
        self.balancing = True
        return Balance(step, why=f"balancing every {self.config.balance_every} steps")

    def roll_back(self, reason: str) -> None:
        self.shards.roll_back(reason)

    @property
    def rolling_back(self) -> bool:
        return self.shards.restore_reason == "diverged"

    def state_lost(self) -> None:
        self.shards.lost(())

    # -- the topology's events -------------------------------------------------------------------------
    def _on_PsNotice(self, ev: PsNotice) -> None:
        self.shards.notice(ev.key, ev.deadline, self.now)

    def _on_PsUp(self, ev: PsUp) -> None:
        self.shards.spare_up(ev.key)

    def _on_PsStartFailed(self, ev: PsStartFailed) -> None:
        self.shards.spare_failed(ev.key)

    def _on_ShardLost(self, ev: ShardLost) -> None:
        self.shards.lost(ev.keys)

    def _on_PlacementRequested(self, ev: PlacementRequested) -> None:
        self.balancing = False
        if ev.decisions:
            self.shards.request_placement(tuple(ev.decisions))
