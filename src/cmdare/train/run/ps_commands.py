"""The Ray driver's parameter-server commands: replacement PS servers, evacuations, parking, fills, restores and
placement changes, carried out by the executors (:class:`~cmdare.train.ps.ps_evacuation.PsServerExecutor`,
:class:`~cmdare.train.ps.placement_changes.PlacementChanges`) on the workers whose process is up. Nothing is
decided here: each command names what to do (its keys, moves, checkpoint)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.kinds import ShardAction
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore

if TYPE_CHECKING:
    from cmdare.control import RunController
    from cmdare.storage import Storage
    from cmdare.train.duties.chief_duties import ChiefDuties
    from cmdare.train.ps.placement_changes import PlacementChanges
    from cmdare.train.ps.ps_evacuation import PsServerExecutor
    from cmdare.train.ps.shard_group import ShardGroup
    from cmdare.train.workers.worker_executor import WorkerExecutor

__all__ = ["PsCommands"]


class PsCommands:
    """The ``_do_<Command>`` handlers of the PS commands, a part of :class:`~cmdare.train.run.ray_driver.RayDriver`
    (which holds the executors and the run's step)."""

    if TYPE_CHECKING:
        controller: RunController
        storage: Storage
        workers: WorkerExecutor
        shards: ShardGroup
        duties: ChiefDuties
        changes: PlacementChanges
        ps: PsServerExecutor
        initial: Checkpoint
        global_step: int
        fence: int
        drained: set[int]
        _round_feed: dict[int, bool]

    def _live_actors(self) -> list[Any]:
        """Worker actors that take a layout change (not revoked, process up)."""
        return [w.actor for w in self.workers.workers.values() if w.revoked_at is None and w.is_up]

    def _do_StartPs(self, cmd: C.StartPs) -> list[E.Event]:
        return self.ps.start_spare(cmd, time.time())

    def _do_PsNoticed(self, cmd: C.PsNoticed) -> None:
        self.ps.noticed(cmd, self.controller.now, "ray" if cmd.key in self.drained else "injected")

    def _do_EvacuatePs(self, cmd: C.EvacuatePs) -> list[E.Event]:
        return [self.ps.evacuate(cmd, self._live_actors(), self.global_step, time.time(), self.controller.now)]

    def _do_ParkPs(self, cmd: C.ParkPs) -> list[E.Event]:
        return [self.ps.park(cmd, time.time(), self.controller.now)]

    def _do_UnparkPs(self, cmd: C.UnparkPs) -> list[E.Event]:
        return [self.ps.unpark(cmd, self._live_actors(), self.global_step, time.time())]

    def _do_FillPs(self, cmd: C.FillPs) -> list[E.Event]:
        return [self.ps.fill(cmd, self._live_actors(), self.global_step, time.time())]

    def _do_KillPs(self, cmd: C.KillPs) -> None:
        self.ps.kill(cmd)

    def _do_Restore(self, cmd: C.Restore) -> list[E.Event]:
        """Replace dead shards by the spares named and roll every shard back to the checkpoint named."""
        wall = time.time()
        step = cmd.checkpoint

        def load() -> Checkpoint:
            return self.initial if step is None else CheckpointStore(self.storage).load_step(step)

        details = {}
        if cmd.reason == "diverged":  # a rollback: say which, and the learning rate from now on
            details = dict(global_step=self.global_step, **self.controller.rollback_details())
        events = [*self.duties.collect(wall), *self.ps.restore(cmd, load, self._live_actors(), self.global_step,
                                                                wall, details)]
        done = events[-1]
        if isinstance(done, E.ActionDone) and done.ok and done.step is not None:
            self.global_step = self.fence = done.step
            self._round_feed.clear()  # the steps come again
        return events

    def _do_ChangePlacement(self, cmd: C.ChangePlacement) -> list[E.Event]:
        before = list(self.shards.servers)
        result, _pause = self.changes.migrate(list(cmd.decisions), self._live_actors(), self.global_step)
        added = [s for s in self.shards.servers if s not in before]
        removed = self.ps.placement_changed(cmd.new_keys, added)
        return [E.ActionDone(wall=time.time(), action=ShardAction.PLACEMENT, ok=not result.rolled_back,
                             num_shards=len(self.shards.shards), removed_keys=removed)]

    def _do_Balance(self, cmd: C.Balance) -> list[E.Event]:
        return self.changes.loads(time.time(), cmd.step, self.ps.dead_keys, balance=True)
