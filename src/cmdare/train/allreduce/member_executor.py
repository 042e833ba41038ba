"""The Ray executor of an all-reduce run's worker commands: members started, joined, revoked, released.

It is the parameter-server run's :class:`~cmdare.train.workers.worker_executor.WorkerExecutor` (servers from the
provider, revocations, losses, the chief, start-up figures) with :class:`~cmdare.train.allreduce.replica.Replica`
actors for workers: there are no shards to lay out, to forget a worker's pieces or to apply the learning rate;
a member takes the learning-rate scale when its group is formed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.train.allreduce.replica import Replica
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.warm_pool import actor_class, worker_threads
from cmdare.train.workers.worker_executor import WorkerExecutor
from cmdare.train.workers.worker_handle import WorkerHandle

__all__ = ["DEADLINE_S", "MemberExecutor"]

DEADLINE_S = 5.0  # the most a member's collective may take before its peers count as lost


class MemberExecutor(WorkerExecutor):
    """The run's members and their servers, as the controller's commands say.

    Args:
        rendezvous: the driver's :class:`~cmdare.collective.Rendezvous` address the members meet at.
        deadline_s: the most a collective may take (a frozen peer is a loss after this long).
    """

    def __init__(self, spec: TrainSpec, provider: ServerProvider, emitter: RunEmitter, detached: DetachedCalls,
                 speed: Callable[[], float], global_step: Callable[[], int], rendezvous: tuple[str, int],
                 deadline_s: float = DEADLINE_S, cloud_now: Callable[[], float] = time.time):
        super().__init__(spec, provider, None, emitter, detached, speed, global_step, cloud_now=cloud_now)
        self.rendezvous, self.deadline_s = rendezvous, deadline_s
        self.lr_scale = 1.0  # the fleet's --lr-policy at the group's size: members take it when formed

    def _new_actor(self, worker_id: int, server: Server, slot: int) -> Any:
        # two calls at once: a probe's ping is answered while the member waits in a collective
        options = {**self._actor_options(server), "max_concurrency": 2}
        return actor_class(Replica).options(**options).remote(
            self.spec, self.rendezvous, self.spec.optimizer_name, worker_id, worker_threads(self.spec),
            self.deadline_s, notice=server.notice)

    def _new_standby(self, server: Server) -> Any:
        """A warm spare: a member built (torch imported, data read, model built, the rendezvous reached) and idle;
        a replacement adopts it and the group heals it."""
        return self._new_actor(0, server, 0)  # its own streams are seeded when it is adopted

    def _worker_args(self, worker_id: int, server: Server, slot: int) -> tuple[Any, ...]:
        """What a warm spare's ``adopt`` takes: the member it becomes."""
        return (worker_id,)

    def _statistics_source(self) -> Any:
        """None: a member's statistics come with the group's heal, not from a copy."""
        return None

    def _layout_version(self) -> int:
        return 0

    def _came_up(self, w: WorkerHandle) -> None:
        """Nothing to hand a member when it is up: its state comes from the group when it is formed."""

    def _forget(self, w: WorkerHandle) -> None:
        """No shard holds a member's pieces: its group is re-formed without it."""

    def _apply_lr(self, scale: float) -> None:
        """The learning rate's scale for the next group (every member takes it when the group is formed)."""
        self.lr_scale = scale
