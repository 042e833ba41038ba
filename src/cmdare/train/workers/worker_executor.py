"""The Ray executor of the run controller's worker commands: servers started, joined, revoked, released.

The controller (:class:`~cmdare.control.RunController`) decides who is chief, the learning-rate scale, what
replaces a lost worker and when an injected revocation is due; this module acts on Ray: it starts worker
actors on servers from the provider (or takes a warm spare), kills revoked servers, reports each worker's
process coming up (or failing to), moves the chief role and pushes the learning rate and round size to the
shards. It records what the store reports of each server (requested, joined, recovery figures).

On a Ray cluster a worker lost by failure may have lost its node: its replacement avoids that node until the GCS
marks it dead, or until it outlived the loss (:mod:`cmdare.train.workers.lost_nodes`); a replacement still waiting
with such a node avoided is then asked for again without (the worker failed, not its node).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.cloud.ray_cluster import AVOID_S
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.lost_nodes import LostNodes
from cmdare.train.workers.warm_pool import (
    StandbyWorker,
    WarmPool,
    actor_class,
    measured_start,
    startup_timings,
    worker_threads,
)
from cmdare.train.workers.worker import Worker
from cmdare.train.workers.worker_handle import WorkerHandle, start_error

__all__ = ["WorkerExecutor"]


class WorkerExecutor:
    """The run's worker actors and servers, as the controller's commands say (``shards``: the parameter
    server's; an all-reduce run's executor, :class:`~cmdare.train.allreduce.member_executor.MemberExecutor`, has
    none and overrides what touches them)."""

    def __init__(self, spec: TrainSpec, provider: ServerProvider, shards: ShardGroup | None, emitter: RunEmitter,
                 detached: DetachedCalls, speed: Callable[[], float], global_step: Callable[[], int],
                 buffers: dict[str, Any] | None = None, cloud_now: Callable[[], float] = time.time):
        self.spec, self.provider, self.shards = spec, provider, shards
        self.emitter, self.detached, self._speed, self._step = emitter, detached, speed, global_step
        self.cloud_now = cloud_now  # the controller's time: emulated in local runs, the wall clock on a cluster
        self.workers: dict[int, WorkerHandle] = {}  # started, not ended
        self.chief: WorkerHandle | None = None
        self.ready_refs: dict[Any, int] = {}  # a starting worker's ready()/adopt() call -> its id
        self.losses: dict[int, dict[str, Any]] = {}  # lost worker -> what its replacement's recovery counts from
        self.initial_buffers = buffers  # batch-norm statistics of a resumed run, for the first wave
        self.num_gpus = 0.0 if spec.gpus_per_worker == "auto" else float(spec.gpus_per_worker)  # set at start
        self.stretch: dict[str, float] = {}  # GPU type -> emulated step stretch (local mixed runs)
        self._reference_step_s: float | None = None  # recent step time of the fastest type's workers
        self.pool: WarmPool | None = None  # the warm spares the controller asked for (--warm-spares)
        self.lost_nodes = LostNodes(provider)  # nodes replacements keep off (a real cluster)

    # -- starting --------------------------------------------------------------------------------------
    def _actor_options(self, server: Server) -> dict[str, Any]:
        return {"num_cpus": self.spec.cpus_per_worker, "num_gpus": self.num_gpus, "max_restarts": 0,
                **self.provider.actor_options(server)}

    def _worker_args(self, worker_id: int, server: Server, slot: int) -> tuple[Any, ...]:
        stretch = self.stretch.get((server.spec.gpu_type or "").lower(), 1.0)
        return (worker_id, slot, self.spec.workers, self.spec, self.shards.shards, self.shards.placement,
                worker_threads(self.spec), self._step(), server.notice, stretch)

    def _new_actor(self, worker_id: int, server: Server, slot: int) -> Any:
        """A new worker actor for data slot ``slot`` on ``server``."""
        args = self._worker_args(worker_id, server, slot)
        return actor_class(Worker).options(**self._actor_options(server)).remote(*args)

    def _new_standby(self, server: Server) -> Any:
        """A warm spare's process on ``server``: a worker's, built and idle until a replacement adopts it."""
        return actor_class(StandbyWorker).options(**self._actor_options(server)).remote(self.spec,
                                                                                         worker_threads(self.spec))

    def _layout_version(self) -> int:
        return self.shards.version

    def start_spare(self, cmd: C.StartSpare, wall: float) -> list[E.Event]:
        """Warm spare ``cmd.key``: a standby server and process (:mod:`cmdare.train.workers.warm_pool`)."""
        if self.pool is None:
            self.pool = WarmPool(self.spec, self.provider, self.emitter, self.detached, self._actor_options,
                                 self._new_standby)
        return self.pool.request(cmd.key, cmd.spec, first_wave=cmd.first_wave, wall=wall)

    def start(self, cmd: C.StartWorker, wall: float) -> list[E.Event]:
        """A server for worker ``cmd.worker_id`` and its process: the first wave's now, a replacement's as a warm
        spare's adoption or a new server (a node the provider starts, or the cluster's autoscaler brings)."""
        first = cmd.replaces is None
        lost = self.losses.get(cmd.replaces) if not first else None
        spare = self.pool.take(cmd.spare) if self.pool is not None and cmd.spare is not None else None
        if spare is not None and spare.actor is not None:  # its process is up or starting: it becomes the worker
            server = spare.server
            args = self._worker_args(cmd.worker_id, server, cmd.slot)
            w = WorkerHandle(cmd.worker_id, cmd.slot, spare.actor, server, replaces=lost,
                             up=spare.actor.adopt.remote(*args), spare="up" if spare.up_at is not None else "starting")
        else:  # a new server, or a spare's whose (emulated) start-up is not over: the worker starts on it cold
            server = spare.server if spare is not None else self.provider.request(cmd.spec)
            if first:
                server.ready_at = server.requested_at
            self.provider.prepare(server, background=not first)  # a replacement's node: the run goes on meanwhile
            actor = self._new_actor(cmd.worker_id, server, cmd.slot)
            server.actor = actor
            w = WorkerHandle(cmd.worker_id, cmd.slot, actor, server, replaces=lost, up=actor.ready.remote(),
                             avoids=self.lost_nodes.avoided(), spare="server" if spare is not None else None)
        w.layout_version = self._layout_version()
        self.workers[w.worker_id] = w
        self.ready_refs[w.up] = w.worker_id
        if first:
            self.emitter.server_event("server_requested", server)
            return [E.ServerStarting(wall=wall, worker_id=w.worker_id, startup_s=0.0)]
        extra: dict[str, Any] = {"replaces": (lost or {}).get("server_id"),
                                 **(spare.details(wall) if spare is not None else {"warm": False})}
        if w.avoids:
            extra["avoids_nodes"] = list(w.avoids)
        startup_s: float | None = None
        if self.provider.emulated:  # cloud seconds / speedup: when the emulated server is ready
            startup_s = max(0.0, server.ready_at - wall) if spare is not None else \
                max(0.0, server.ready_at - server.requested_at)
            extra.setdefault("startup_s", startup_s)
        self.emitter.server_event("replacement_requested", server, worker_id=cmd.replaces, extra=extra)
        return [E.ServerStarting(wall=wall, worker_id=w.worker_id, startup_s=startup_s)]

    def up(self, ref: Any, wall: float) -> list[E.Event]:
        """A worker's ready() or adopt() returned: its process is up (or failed to start)."""
        import ray

        wid = self.ready_refs.pop(ref)
        w = self.workers.get(wid)
        if w is None:  # given up meanwhile
            self.detached.add(ref)
            return []
        try:
            got = ray.get(ref)
        except Exception as err:  # noqa: BLE001 - its constructor raised, or its node died before it ran
            message, deterministic = start_error(err)
            return [E.WorkerStartFailed(wall=wall, worker_id=wid, error=message, deterministic=deterministic)]
        node_id, up_at = (got["node_id"], got["up_at"]) if isinstance(got, dict) else got
        w.is_up, w.node_id = True, node_id
        if not self.provider.emulated and w.replaces is not None:
            startup_s, registered = measured_start(w.server, node_id, up_at)
            self.emitter.server_event("replacement_started", w.server, worker_id=wid,
                                      extra={"node_id": node_id, "startup_s": startup_s,
                                             "node_registered_at": registered})
        self._came_up(w)
        return [E.WorkerUp(wall=wall, worker_id=wid)]

    def _came_up(self, w: WorkerHandle) -> None:
        """A worker's process is up: the shards' layout if it changed while it started, the batch-norm
        statistics it starts from."""
        if w.layout_version != self.shards.version:  # the shards changed while it started
            self.detached.add(w.actor.set_layout.remote(self.shards.placement, self.shards.shards))
        buffers = self._buffers_for(w)
        if buffers is not None:
            self.detached.add(w.actor.load_buffers.remote(buffers))

    def _buffers_for(self, w: WorkerHandle) -> Any:
        """Batch-norm statistics a newcomer starts from: a resumed run's, else the warm pool's copy (seconds
        old), else the chief's (a reference: nobody waits); None for the first wave of a fresh run."""
        if w.replaces is None:
            return self.initial_buffers
        if self.pool is not None and self.pool.buffers is not None:
            return self.pool.buffers
        source = self._buffer_source(w)
        if source is None:
            return None
        ref = source.actor.buffers.remote()
        self.detached.add(ref)
        return ref

    def _statistics_source(self) -> Any:
        """The actor whose batch-norm statistics the warm pool keeps a copy of (None: none that trained yet)."""
        source = self._buffer_source(None)
        return source.actor if source is not None and source.server.joined_at else None

    def _buffer_source(self, newcomer: WorkerHandle | None) -> WorkerHandle | None:
        """The chief, else another worker that trained and was not revoked."""
        others = [w for w in self.workers.values() if w is not newcomer and w.revoked_at is None and w.is_up]
        if any(w is self.chief for w in others):
            return self.chief
        joined = [w for w in others if w.server.joined_at is not None]
        return min(joined or others, key=lambda w: w.worker_id, default=None)

    def tick(self, wall: float) -> list[E.Event]:
        """The warm pool's upkeep (standbys started, found lost, the chief's statistics copied) and the lost nodes
        replacements avoid: a waiting one is asked for again without a node that turned out alive. Returns what
        the controller is to hear (spares up or lost)."""
        events: list[E.Event] = []
        if self.pool is not None:
            self.pool.tick(wall, self._statistics_source())
            events += self.pool.reports()
        for node_id in self.lost_nodes.settle(wall):
            for w in [w for w in self.workers.values() if node_id in w.avoids and not w.is_up]:
                self._ask_again(w, f"kept off node {node_id}, which is still alive {AVOID_S:g} s after its worker "
                                   "was lost (the worker failed, not its node)")
        return events

    def _ask_again(self, w: WorkerHandle, reason: str) -> None:
        """A new actor for the waiting replacement ``w`` (its options as they are now); the old one is killed."""
        import ray

        self.ready_refs.pop(w.up, None)
        self.detached.add(w.up)
        with contextlib.suppress(Exception):
            ray.kill(w.actor)
        w.actor = w.server.actor = self._new_actor(w.worker_id, w.server, w.slot)
        previous, w.avoids, w.up = w.avoids, self.lost_nodes.avoided(), w.actor.ready.remote()
        self.ready_refs[w.up] = w.worker_id
        self.emitter.server_event("replacement_retried", w.server, worker_id=w.worker_id,
                                  extra={"reason": reason, "avoided_nodes": list(previous),
                                         "avoids_nodes": list(w.avoids),
                                         "replaces_worker": (w.replaces or {}).get("worker_id")})

    def joined_run(self, cmd: C.Joined) -> None:
        """A replacement joined the run (its server is ready: in emulation when its emulated start-up ended, its
        process may still be starting; on a cluster when its process is up)."""
        w = self.workers.get(cmd.worker_id)
        if w is None:
            return
        server = w.server
        startup = server.ready_at - server.requested_at if self.provider.emulated else None
        self.emitter.server_event("replacement_joined", server, worker_id=w.worker_id,
                                  extra={"recovery_s": cmd.recovery_s, "replaces_worker": cmd.replaces,
                                         "startup_s": startup, "warm": w.spare is not None, "spare": w.spare,
                                         "clock": "emulated" if self.provider.emulated else "wall"})

    def joined(self, w: WorkerHandle, at: float, global_step: int) -> None:
        """The worker's first chunk, begun ``at``, ended: it trains (``server_joined`` for the first wave); a
        replacement reports how long it took, in wall seconds, from the loss to training again
        (``replacement_trained``: detection, server start, process start, first pull)."""
        server = w.server
        server.joined_at = at
        if w.replaces is None:
            self.emitter.server_event("server_joined", server, worker_id=w.worker_id)
            return
        lost = w.replaces
        recovery_s = at - lost["revoked_at"]
        made = global_step - lost.get("step_at_loss", global_step)
        steps_lost = max(0.0, lost["speed_before"] * recovery_s - made)
        self.emitter.server_event("replacement_trained", server, worker_id=w.worker_id,
                                  extra={"recovery_s": recovery_s, "replaces_worker": lost["worker_id"],
                                         "joining_s": max(0.0, at - server.ready_at),
                                         "steps_per_s_before": lost["speed_before"], "steps_lost": steps_lost,
                                         "warm": w.spare is not None, "spare": w.spare, **startup_timings(w.up)})

    # -- emulated GPU types ------------------------------------------------------------------------------
    def _stretch_of(self, w: WorkerHandle) -> float:
        return self.stretch.get((w.server.spec.gpu_type or "").lower(), 1.0)

    def observe_step_time(self, w: WorkerHandle, steps: int, duration_s: float) -> None:
        """A chunk of a worker of the fastest type present: its step time is the emulation's reference."""
        if self.stretch and steps and self._stretch_of(w) == 1.0:
            t = duration_s / steps
            ref = self._reference_step_s
            self._reference_step_s = t if ref is None else 0.7 * ref + 0.3 * t

    def step_target_s(self, w: WorkerHandle) -> float:
        """How long each step of ``w`` must last to train at its type's speed (0: no emulation or no
        reference yet); a reference shared by all workers keeps the ratio when they slow each other down."""
        stretch = self._stretch_of(w)
        if stretch <= 1.0 or self._reference_step_s is None:
            return 0.0
        return stretch * self._reference_step_s

    # -- the controller's commands -----------------------------------------------------------------------
    def revoke(self, cmd: C.Revoke) -> None:
        """Kill the worker's (emulated or injected) server now."""
        w = self.workers.get(cmd.worker_id)
        if w is None or w.revoked_at is not None:
            return
        t_kill = time.time()
        self.provider.revoke(w.server)
        w.revoked_at = time.time()
        self.emitter.event("revocation", worker_id=w.worker_id, server_id=w.server.server_id,
                           details={"source": cmd.source, "uptime_s": w.server.uptime_s(), "chief": w is self.chief,
                                    "kill_s": w.revoked_at - t_kill})

    def lose(self, cmd: C.LoseWorker, error: str | None = None) -> None:
        """The worker is no member any more: its server ends, the shards forget its pieces; a loss that was no
        notice is reported with the delay from its revocation to now."""
        w = self.workers.pop(cmd.worker_id, None)
        if w is None:
            return
        now = time.time()
        if cmd.reason != "notice":
            if w.revoked_at is None:  # not injected: a real failure or an outside revocation
                w.revoked_at = now
                self.lost_nodes.lost(w.node_id, now)  # its node may have died with it, the GCS not knowing yet
                self.emitter.event("revocation", worker_id=w.worker_id, server_id=w.server.server_id,
                                   details={"source": "failure", "error": error or cmd.reason})
            if w.server.alive:
                self.emitter.end_server(w.server, "revoked")
            self.emitter.event("worker_lost", worker_id=w.worker_id, server_id=w.server.server_id,
                               details={"detection_delay_s": now - w.revoked_at, "steps_per_s_before": self._speed(),
                                        "reason": cmd.reason, "detected": cmd.detected, "replaced": cmd.replaced,
                                        "cloud_time": self.cloud_now()})
            with contextlib.suppress(Exception):
                import ray

                ray.kill(w.actor)
        self._forget(w)
        self.losses[w.worker_id] = {"revoked_at": w.revoked_at or now, "worker_id": w.worker_id,
                                    "server_id": w.server.server_id, "speed_before": self._speed(),
                                    "step_at_loss": self._step()}
        if self.chief is w:
            self.chief = None

    def _forget(self, w: WorkerHandle) -> None:
        """The shards forget a lost worker's pieces of a gradient."""
        self.shards.forget_worker(w.worker_id)

    def leave(self, cmd: C.ReleaseWorker) -> None:
        """A noticed worker leaves cleanly: stop its watchers and channels, end its server, kill its process."""
        import ray

        w = self.workers.get(cmd.worker_id)
        if w is None:
            return
        w.revoked_at = w.revoked_at or time.time()
        ref = w.actor.leave.remote()
        try:
            ray.get(ref, timeout=5)
        except ray.exceptions.GetTimeoutError:
            self.detached.add(ref)  # still running when the actor is killed below: its failure is fetched later
        except Exception:  # noqa: BLE001 - the server is leaving anyway
            pass
        self.emitter.end_server(w.server, "notice")
        with contextlib.suppress(Exception):
            ray.kill(w.actor)

    def notice(self, w: WorkerHandle, notice: dict[str, Any]) -> None:
        """Report a preemption notice the worker saw (its chunk stopped for it)."""
        w.revoked_at = time.time()
        self.emitter.event("notice", worker_id=w.worker_id, server_id=w.server.server_id,
                           details=dict(notice, chief=w is self.chief))

    def cancel(self, cmd: C.CancelWorker) -> None:
        """A replacement that never ran is given up (it bills nothing: its server never started)."""
        import ray

        w = self.workers.pop(cmd.worker_id, None)
        if w is None:
            return
        self.ready_refs = {r: wid for r, wid in self.ready_refs.items() if wid != w.worker_id}
        if w.up is not None:
            self.detached.add(w.up)
        with contextlib.suppress(Exception):
            ray.kill(w.actor)
        server = w.server
        server.end("not_started", started=False)
        self.emitter.end_server(server, "not_started")
        waited = time.time() - server.requested_at
        if cmd.retried:  # its start failed, not by its own fault: the same server is asked for again
            self.emitter.server_event("replacement_retried", server, worker_id=w.worker_id,
                                      extra={"reason": cmd.reason, "waited_s": waited, "avoids_nodes": list(w.avoids),
                                             "replaces_worker": (w.replaces or {}).get("worker_id")})
        elif cmd.reason == "cancelled":
            self.emitter.server_event("replacement_cancelled", server, worker_id=w.worker_id,
                                      extra={"waited_s": waited})
        else:
            self.emitter.server_event("replacement_timeout", server, worker_id=w.worker_id,
                                      extra={"reason": cmd.reason, "waited_s": waited,
                                             "replaces_worker": (w.replaces or {}).get("worker_id")})

    def set_chief(self, cmd: C.SetChief) -> None:
        self.chief = self.workers.get(cmd.worker_id) if cmd.worker_id is not None else None
        if cmd.announce:
            self.emitter.event("chief_change", worker_id=cmd.worker_id,
                               details={"from": cmd.previous, "to": cmd.worker_id})

    def set_lr(self, cmd: C.SetLrScale) -> None:
        self._apply_lr(cmd.scale)
        self.emitter.event("lr_change", details={"policy": self.spec.lr_policy, "scale": cmd.scale,
                                                 "from": cmd.previous, "active_workers": cmd.active})

    def _apply_lr(self, scale: float) -> None:
        """Every shard applies the learning rate times ``scale`` from now on."""
        self.shards.set_lr_scale(scale)

    # -- the end ------------------------------------------------------------------------------------------
    def release(self) -> None:
        """End every live worker's server and every warm spare's (the run is over)."""
        for w in list(self.workers.values()):
            if w.server.alive:
                if not w.is_up and not self.provider.emulated:  # never came up: it billed nothing
                    w.server.end("not_started", started=False)
                self.emitter.end_server(w.server, w.server.end_reason or "released")
        if self.pool is not None:
            self.pool.release()

    def kill_all(self) -> None:
        """Kill every worker actor and warm spare (at shutdown)."""
        import ray

        for w in self.workers.values():
            with contextlib.suppress(Exception):  # already gone
                ray.kill(w.actor)
        if self.pool is not None:
            self.pool.kill_all()
