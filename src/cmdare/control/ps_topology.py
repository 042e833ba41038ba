"""Training through parameter-server shards, as the fleet's :class:`~cmdare.control.topology.Topology`.

The shards' servers, their spares and the actions on quiesced shards (restore, evacuate, park, unpark, fill,
placement changes) are :class:`~cmdare.control.shard_control.ShardControl`'s; this adds what a parameter server
means for the rest of the run: asynchronous members add their speeds, synchronous rounds go at the slowest
member's and are sized to the workers they wait for, and the placement's sources (:mod:`cmdare.control.balancers`:
PSLD's balancer, the bottleneck watch of :mod:`cmdare.control.mitigation`, a script) see the shards' loads and the
chunks' times and decide placement changes every ``balance_every`` steps (a script at every pass); ``cmdare ps``
requests become decisions against the placement as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cmdare.control.balancers import (
    DecisionSource,
    decisions_for_request,
    evacuation_moves,
    fill_decisions,
    onto_replacement_moves,
)
from cmdare.control.kinds import Destination
from cmdare.control.ps_servers import PsServerKernel
from cmdare.control.run_commands import Balance, Command, EvacuatePs, FillPs, Note, SetRoundSize
from cmdare.control.shard_control import ShardControl
from cmdare.control.topology import Quiesce

if TYPE_CHECKING:
    from cmdare.cloud.servers import ServerSpec
    from cmdare.control.duties import DutySchedule
    from cmdare.control.run_config import RunConfig
    from cmdare.control.run_events import (
        ActionDone,
        ChunkDone,
        GroupBroken,
        PlacementRequested,
        PsNotice,
        PsStartFailed,
        PsUp,
        ShardLoads,
        ShardLost,
    )
    from cmdare.control.worker_control import WorkerControl

__all__ = ["PsTopology"]


class PsTopology:
    """Parameter-server training: shards on servers of their own, asynchronous or in synchronous rounds.

    Args:
        balancer: who changes the placement while training (None: nobody; ``cmdare ps`` requests still can).
        placement: the shards' placement at the start (:class:`~cmdare.ps.placement.Placement`; None where the
            driver keeps none, as the simulator); drivers report it after every change.
        duties: the fleet's duty schedule: the newest checkpoint the run stored, which a restore goes back to,
            and the uploads under way, which it waits for.
    """

    def __init__(self, config: RunConfig, kernel: PsServerKernel, out: list[Command],
                 balancer: DecisionSource | None = None, placement: Any = None,
                 duties: DutySchedule | None = None):
        self.config, self.out = config, out
        self.shards = ShardControl(config, kernel, out, duties)
        self.balancer, self.placement = balancer, placement
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

    def snapshot(self) -> dict[str, Any] | None:
        return self.shards.snapshot()

    def resume(self, saved: dict[str, Any] | None) -> None:
        self.shards.resume(saved)

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

    def unanswered(self) -> bool:
        return self.shards.unanswered()

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
        grown), or shards that cannot be used (dead, parked): training holds. In emulation a synchronous round also
        holds at the step a newcomer's emulated start-up ends until its process is up (cloud time is the run's
        steps: the round grows at that step, as in the simulator, whatever the emulator's process start takes)."""
        action = self.shards.next_action(now)
        arriving = self.config.sync and workers.arriving()
        grow = self.config.sync and not arriving and workers.counted() > self.round_size
        if action is None and not grow and not arriving and not self.shards.blocked(now):
            return None
        why = (type(action).__name__ if action is not None else "newcomer" if arriving else "round" if grow
               else "shards")
        if not quiesced:
            return Quiesce(why)
        if action is not None:
            return Quiesce(why, action=self._with_moves(action))  # carried out now: its moves decided now
        if grow:
            self.round_size = workers.counted()
            return Quiesce(why, then=SetRoundSize(self.round_size, wait=True,
                                                  why=f"a newcomer grows the synchronous round to {self.round_size}"))
        return Quiesce(why)

    def _with_moves(self, action: Command | None) -> Command | None:
        """An evacuation or a fill with the block moves that carry it out, decided on the placement as it is (where
        the driver keeps one): the placement's sources' plan (PSLD's), else the least-loaded survivors, by bytes."""
        if self.placement is None:
            return action
        if isinstance(action, EvacuatePs):
            shard = self.shards.index_of(action.key)
            moves = (onto_replacement_moves(self.placement, shard) if action.onto == Destination.REPLACEMENT
                     else evacuation_moves(self.balancer, self.placement, shard))
            return dataclasses.replace(action, moves=tuple(moves))
        if isinstance(action, FillPs):
            return dataclasses.replace(action, moves=tuple(fill_decisions(self.balancer, self.placement)))
        return action

    def action_done(self, command: Command, ev: ActionDone) -> None:
        """The shards' records, and the sources told what was carried out (the placement afterwards)."""
        if ev.placement is not None:
            self.placement = ev.placement
        if self.balancer is not None:
            for done, moved_bytes, pause_s in ev.migrations:
                self.balancer.applied(list(done), self.placement, moved_bytes, pause_s)
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
        """A balancing step passed: have the shards' load measured (the balancers decide on the answer); a source
        that decides at every pass (a script) is asked now. Changes wait for quiesced shards."""
        if self.balancer is not None and self.balancer.every_tick and not self.shards.placements \
                and self.placement is not None:
            self._decide(step, f"a placement source that decides at every pass, at step {step}")
        if not self.balance_at or step < self.balance_at or self.balancing:
            return None
        self.balance_at = (step // self.config.balance_every + 1) * self.config.balance_every
        self.balancing = True
        return Balance(step, why=f"balancing every {self.config.balance_every} steps")

    def _decide(self, step: int, why: str) -> None:
        """Ask the sources for placement changes now; hand on what they report."""
        assert self.balancer is not None
        decisions = self.balancer.decide(step, self.placement)
        for kind, details in self.balancer.take_reports():
            self.out.append(Note(kind, details, why=f"the bottleneck watch at step {step}"))
        if decisions:
            self.shards.request_placement(tuple(decisions), why=why)

    def chunk_done(self, ev: ChunkDone) -> None:
        """A chunk's times, for the sources that watch worker speed (bottleneck detection)."""
        if self.balancer is not None and ev.steps:
            self.balancer.observe_chunk(ev.worker_id, ev.steps, ev.duration_s, ev.compute_s)

    def roll_back(self, reason: str) -> None:
        self.shards.roll_back(reason)

    @property
    def rolling_back(self) -> bool:
        return self.shards.restore_reason == "diverged"

    def state_lost(self) -> None:
        self.shards.lost(())

    # -- the topology's events -------------------------------------------------------------------------
    def _on_GroupBroken(self, ev: GroupBroken) -> None:
        """A parameter-server run forms no all-reduce group: nothing to do."""

    def _on_PsNotice(self, ev: PsNotice) -> None:
        self.shards.notice(ev.key, ev.deadline, self.now)

    def _on_PsUp(self, ev: PsUp) -> None:
        self.shards.spare_up(ev.key)

    def _on_PsStartFailed(self, ev: PsStartFailed) -> None:
        self.shards.spare_failed(ev.key)

    def _on_ShardLost(self, ev: ShardLost) -> None:
        self.shards.lost(ev.keys)

    def _on_ShardLoads(self, ev: ShardLoads) -> None:
        """The shards' load measured: the sources observe it; on a balancing step's answer they decide."""
        if ev.placement is not None:
            self.placement = ev.placement
        step = int(ev.global_step) if ev.global_step is not None else 0
        if self.balancer is not None and ev.stats:
            self.balancer.observe(list(ev.stats), step)
        if ev.balance:
            self.balancing = False
            if self.balancer is not None and self.placement is not None:
                self._decide(step, f"the placement's sources (PSLD, the bottleneck watch) at balancing step {step}")

    def _on_PlacementRequested(self, ev: PlacementRequested) -> None:
        """``cmdare ps`` requests (against the placement as it is) or ready decisions."""
        decisions = list(ev.decisions)
        if self.placement is not None:
            for request in ev.requests:
                decisions += decisions_for_request(request, self.placement)
        if decisions:
            self.shards.request_placement(tuple(decisions), why="asked for (cmdare ps)")
