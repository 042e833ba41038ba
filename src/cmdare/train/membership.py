"""The Ray executor of the control kernel's membership decisions.

The kernel (:class:`cmdare.control.MembershipKernel`) decides: who is chief, the learning-rate scale,
what replaces a lost worker, when an injected revocation is due. This module acts: it starts worker
actors on servers from the provider, kills revoked servers, requests replacements, moves the chief
role and pushes the new learning rate and round size to the shards. The simulator executes the same
decisions with SimPy (:mod:`cmdare.plan.simulator`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.cloud.servers import ServerSpec
from cmdare.control import (
    ChiefChange,
    Decision,
    LrChange,
    MembershipKernel,
    NoWorkersLeft,
    RequestReplacement,
    WorkerInfo,
)
from cmdare.train.detached import DetachedCalls
from cmdare.train.emitter import RunEmitter
from cmdare.train.gpu_speeds import catalog_offers
from cmdare.train.shard_group import ShardGroup
from cmdare.train.spec import TrainSpec
from cmdare.train.warm_pool import WarmPool, actor_class, measured_start, spare_spec, startup_timings, worker_threads
from cmdare.train.worker import Worker

__all__ = ["MembershipExecutor", "WorkerHandle", "catalog_offers"]


@dataclass
class WorkerHandle:
    """A running worker: its actor, data slot and server."""

    worker_id: int
    slot: int
    actor: Any
    server: Server
    revoked_at: float | None = None  # when it was revoked (injected) or told to leave (notice)
    replaces: dict[str, Any] | None = None  # the loss this worker replaces (for recovery times)
    up: Any = None  # a replacement's ready() or adopt() call: when its worker was up (start-up figures)
    spare: str | None = None  # a replacement that was a warm spare: "up" (warm) or "starting" when taken


class MembershipExecutor:
    """Workers of a run: started, revoked, lost, replaced, as the kernel decides."""

    def __init__(self, spec: TrainSpec, kernel: MembershipKernel, provider: ServerProvider, shards: ShardGroup,
                 emitter: RunEmitter, detached: DetachedCalls, speed: Callable[[], float],
                 global_step: Callable[[], int]):
        self.spec, self.kernel, self.provider, self.shards = spec, kernel, provider, shards
        self.emitter, self.detached, self._speed, self._step = emitter, detached, speed, global_step
        self.workers: dict[int, WorkerHandle] = {}
        self.chief: WorkerHandle | None = None
        self.pending: list[tuple[Server, int, dict[str, Any]]] = []  # replacements on their way
        # On a real cluster: replacement workers waiting for the node the autoscaler launches, by their
        # ready() reference; they join the run (and a synchronous round) once their process is up.
        self.starting: dict[Any, WorkerHandle] = {}
        self.no_workers_left = False
        self.started_at: float | None = None  # the first step's start (injected revocations count from it)
        self.num_gpus = 0.0 if spec.gpus_per_worker == "auto" else float(spec.gpus_per_worker)  # set at start
        self.stretch: dict[str, float] = {}  # GPU type -> emulated step stretch (local mixed runs)
        self._reference_step_s: float | None = None  # recent step time of the fastest type's workers
        self._next_id = 0
        self.pool: WarmPool | None = None  # the warm spares (spec.warm_spares > 0)

    # -- starting workers ------------------------------------------------------------------------
    def _actor_options(self, server: Server) -> dict[str, Any]:
        return {"num_cpus": self.spec.cpus_per_worker, "num_gpus": self.num_gpus, "max_restarts": 0,
                **self.provider.actor_options(server)}

    def _worker_args(self, server: Server, slot: int, start_step: int) -> tuple[Any, ...]:
        """A new worker's id and the rest of ``Worker``'s arguments."""
        worker_id, self._next_id = self._next_id, self._next_id + 1
        stretch = self.stretch.get((server.spec.gpu_type or "").lower(), 1.0)
        return (worker_id, slot, self.spec.workers, self.spec, self.shards.shards, self.shards.placement,
                worker_threads(self.spec), start_step, server.notice, stretch)

    def _start_worker(self, server: Server, slot: int, start_step: int, member: bool = True) -> WorkerHandle:
        self.provider.prepare(server)
        args = self._worker_args(server, slot, start_step)
        server.actor = actor = actor_class(Worker).options(**self._actor_options(server)).remote(*args)
        handle = WorkerHandle(args[0], slot, actor, server)
        if member:
            self.workers[handle.worker_id] = handle
        return handle

    def _adopt(self, server: Server, slot: int) -> tuple[WorkerHandle, bool]:
        """A warm spare's process becomes the worker of ``slot`` and pulls (once warm, if it is still
        starting); returns its handle and whether it was warm already."""
        assert self.pool is not None
        spare = self.pool.taken.pop(server.server_id)
        args = self._worker_args(server, slot, self._step())
        up = spare.up_at is not None
        w = WorkerHandle(args[0], slot, spare.actor, server, up=spare.actor.adopt.remote(*args),
                         spare="up" if up else "starting")
        if up or self.provider.emulated:
            self.workers[w.worker_id] = w
        return w, up

    @staticmethod
    def _info(w: WorkerHandle) -> WorkerInfo:
        return WorkerInfo(w.worker_id, w.slot, w.server.spec, w.server.ready_at)

    def start(self, worker_specs: Sequence[ServerSpec], step: int) -> None:
        """The first wave: one server (of its slot's spec) and worker per data slot (its start-up is not part
        of the run)."""
        handles = []
        for slot, worker_spec in enumerate(worker_specs):
            server = self.provider.request(worker_spec)
            server.ready_at = server.requested_at
            self.emitter.server_event("server_requested", server)
            handles.append(self._start_worker(server, slot, step))
        if self.spec.warm_spares:
            self.pool = WarmPool(self.spec.warm_spares, self.spec, self.provider, self.emitter, self.detached,
                                 self._actor_options)
            self.pool.start(spare_spec(worker_specs))
        # the first chief is elected silently: a chief_change event reports a handover
        self._execute(self.kernel.start([self._info(w) for w in handles], time.time()), announce_chief=False)

    def arrive(self, now: float) -> list[WorkerHandle]:
        """Start workers on replacement servers that are ready by ``now``; returns those that joined.

        On a real cluster a replacement's server is the node the autoscaler launches for its actor: the
        actor is created at once and joins when :meth:`started` sees its process up. A warm spare that is up
        joins at once, everywhere; one still starting joins as a cold replacement would.
        """
        arrived = [p for p in self.pending if p[0].ready_at <= now]
        self.pending = [p for p in self.pending if p[0].ready_at > now]
        out = []
        for server, slot, lost in arrived:
            up = self.provider.emulated
            if self.pool is not None and server.server_id in self.pool.taken:
                w, up = self._adopt(server, slot)
            else:
                w = self._start_worker(server, slot, self._step(), member=up)
                w.up = w.actor.ready.remote()
            w.replaces = lost
            if up or self.provider.emulated:
                self.detached.add(w.up)  # read by joined(); fetched here if the worker dies first
                out.append(self._admit(w, now))
            else:
                self.starting[w.up] = w
        if self.pool is not None:  # after the spares taken were adopted: a new standby's start waits for this
            source = self._buffer_source(None)
            self.pool.tick(now, source.actor if source is not None and source.server.joined_at else None)
        return out

    def started(self, ref: Any, now: float) -> WorkerHandle | None:
        """A waiting replacement's ``ready()`` returned: its node registered and its process is up, so it
        joins (phases measured: request -> node registered -> worker up). None if it failed to start."""
        import ray

        w = self.starting.pop(ref)
        try:
            got = ray.get(ref)  # ready(): (node, up at); a warm spare's adopt(): its figures
            node_id, up_at = (got["node_id"], got["up_at"]) if isinstance(got, dict) else got
        except Exception as err:  # noqa: BLE001 - its node or process died before it ran: try again
            self._replacement_failed(w, now, f"its worker failed to start ({type(err).__name__})")
            return None
        startup_s, registered = measured_start(w.server, node_id, up_at)
        self.emitter.server_event("replacement_started", w.server, worker_id=w.worker_id,
                                  extra={"node_id": node_id, "startup_s": startup_s, "node_registered_at": registered})
        self.workers[w.worker_id] = w
        # the placement may have changed while it waited: adopt today's (queued before its first chunk)
        self.detached.add(w.actor.set_layout.remote(self.shards.placement, self.shards.shards))
        return self._admit(w, now)

    def expire(self, now: float) -> None:
        """Give up replacements whose node has not come within ``spec.replacement_timeout_s``."""
        for ref, w in list(self.starting.items()):
            if now - w.server.requested_at >= self.spec.replacement_timeout_s:
                del self.starting[ref]
                self.detached.add(ref)
                self._replacement_failed(w, now, f"no node within {self.spec.replacement_timeout_s:g} s")

    def cancel_starting(self) -> None:
        """The run is over: withdraw replacements still waiting for a node (the autoscaler's demand goes)."""
        for ref, w in list(self.starting.items()):
            del self.starting[ref]
            self.detached.add(ref)
            self._end_unstarted(w, "cancelled")
            self.emitter.server_event("replacement_cancelled", w.server, worker_id=w.worker_id,
                                      extra={"waited_s": time.time() - w.server.requested_at})

    def _replacement_failed(self, w: WorkerHandle, now: float, why: str) -> None:
        self._end_unstarted(w, "not_started")
        self.emitter.server_event("replacement_timeout", w.server, worker_id=w.worker_id,
                                  extra={"reason": why, "waited_s": now - w.server.requested_at,
                                         "replaces_worker": (w.replaces or {}).get("worker_id")})
        self._execute(self.kernel.replacement_failed(w.slot, now), w.replaces)

    def _end_unstarted(self, w: WorkerHandle, reason: str) -> None:
        """Kill a replacement that never ran; its server never started, so it bills nothing."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(w.actor)
        server = w.server
        server.ended_at, server.end_reason = server.requested_at, reason  # zero uptime: nothing billed
        self.emitter.end_server(server, reason)

    def _admit(self, w: WorkerHandle, now: float) -> WorkerHandle:
        """A started replacement becomes a member: batch-norm statistics, round size, the kernel's join."""
        # Batch-norm running statistics live in the workers, not on the shards: a newcomer starts from the
        # chief's, so it evaluates and checkpoints well if it becomes chief soon after joining: the warm pool's
        # copy (seconds old), else a reference to the chief's (the coordinator does not wait).
        source = self._buffer_source(w)
        buffers = self.pool.buffers if self.pool is not None else None
        if buffers is None and source is not None:
            buffers = source.actor.buffers.remote()
            self.detached.add(buffers)
        if buffers is not None:
            self.detached.add(w.actor.load_buffers.remote(buffers))
        self.shards.set_num_workers(len(self.workers), wait=True)
        self._execute(self.kernel.join(self._info(w), now))
        return w

    def _buffer_source(self, newcomer: WorkerHandle | None) -> WorkerHandle | None:
        """The worker a newcomer copies batch-norm statistics from: the chief, else another worker, that
        was not revoked (a revoked worker may still be listed until its loss is detected)."""
        others = [w for w in self.workers.values() if w is not newcomer and w.revoked_at is None]
        if any(w is self.chief for w in others):
            return self.chief
        joined = [w for w in others if w.server.joined_at is not None]
        return min(joined or others, key=lambda w: w.worker_id, default=None)

    def joined(self, w: WorkerHandle, at: float, global_step: int) -> None:
        """The worker's first chunk, begun ``at``, ended: it has joined (injected revocations may hit it
        from now on), and a replacement reports its recovery."""
        server = w.server
        server.joined_at = at
        if self.started_at is None:
            self.started_at = at
        self.kernel.trained(w.worker_id, at)
        if w.replaces is None:
            self.emitter.server_event("server_joined", server, worker_id=w.worker_id)
            return
        lost = w.replaces
        recovery_s = at - lost["revoked_at"]
        # steps the cluster fell short of its pre-loss speed over the recovery interval (measured)
        made = global_step - lost.get("step_at_loss", global_step)
        steps_lost = max(0.0, lost["speed_before"] * recovery_s - made)
        self.emitter.server_event("replacement_joined", server, worker_id=w.worker_id,
                                  extra={"recovery_s": recovery_s, "replaces_worker": lost["worker_id"],
                                         "startup_s": server.ready_at - server.requested_at,
                                         "joining_s": max(0.0, at - server.ready_at),
                                         "steps_per_s_before": lost["speed_before"], "steps_lost": steps_lost,
                                         "warm": w.spare is not None, "spare": w.spare, **startup_timings(w.up)})

    # -- emulated GPU types ---------------------------------------------------------------------
    def _stretch_of(self, w: WorkerHandle) -> float:
        return self.stretch.get((w.server.spec.gpu_type or "").lower(), 1.0)

    def observe_step_time(self, w: WorkerHandle, steps: int, duration_s: float) -> None:
        """A chunk of a worker of the fastest type present: its step time is the emulation's reference."""
        if self.stretch and steps and self._stretch_of(w) == 1.0:
            t = duration_s / steps
            ref = self._reference_step_s
            self._reference_step_s = t if ref is None else 0.7 * ref + 0.3 * t

    def step_target_s(self, w: WorkerHandle) -> float:
        """How long each step of ``w`` must last to train at its type's speed: its stretch times the fastest
        type's recent step time, on this machine (0: no emulation, or no reference yet, when the worker
        stretches its own step time instead). A reference shared by all workers keeps the ratio when the
        workers slow each other down on this machine's cores."""
        stretch = self._stretch_of(w)
        if stretch <= 1.0 or self._reference_step_s is None:
            return 0.0
        return stretch * self._reference_step_s

    # -- losing workers --------------------------------------------------------------------------
    def inject_revocations(self, now: float, workers: bool = True, others: Sequence[Any] = ()) -> list[int]:
        """Revoke the workers the kernel's revocation source says are due (only workers that trained).

        ``others`` are transient PS servers the source may pick among too; their keys (negative) are returned
        for the PS executor. ``workers=False``: the source hits PS servers only."""
        if self.started_at is None:
            return []
        due = self.kernel.due(now, self.started_at, workers=workers and self.spec.transient, others=others)
        for wid in due:
            w = self.workers.get(wid)
            if w is None or w.revoked_at is not None:
                continue
            t_kill = time.time()
            self.provider.revoke(w.server)
            self.kernel.mark_revoked(wid)
            # The emulated revocation runs on the coordinator's own thread, which can notice nothing while
            # it kills: detection and recovery are timed from the end of the kill (kill_s says how long).
            w.revoked_at = time.time()
            self.emitter.event("revocation", worker_id=w.worker_id, server_id=w.server.server_id,
                               details={"source": "injected", "uptime_s": w.server.uptime_s(),
                                        "chief": w is self.chief, "kill_s": w.revoked_at - t_kill})
        return [wid for wid in due if wid < 0]

    def lost(self, w: WorkerHandle, err: Exception | None, replace: bool = True) -> None:
        """Drop a dead worker; the kernel re-elects the chief and may ask for a replacement."""
        if w.worker_id not in self.workers:
            return
        now = time.time()
        del self.workers[w.worker_id]
        if w.revoked_at is None:  # not injected: a real failure or an outside revocation
            w.revoked_at = now
            self.emitter.event("revocation", worker_id=w.worker_id, server_id=w.server.server_id,
                               details={"source": "failure", "error": type(err).__name__ if err else "unreachable"})
        self.emitter.end_server(w.server, "revoked")
        decisions = self.kernel.lose(w.worker_id, now, replace)
        replaced = any(isinstance(d, RequestReplacement) for d in decisions)
        self.emitter.event("worker_lost", worker_id=w.worker_id, server_id=w.server.server_id,
                           details={"detection_delay_s": now - w.revoked_at, "steps_per_s_before": self._speed(),
                                    "reason": "revoked", "detected": err is not None, "replaced": replaced})
        self._depart(w, decisions)

    def leave(self, w: WorkerHandle, notice: dict[str, Any], checkpoint: Callable[[WorkerHandle], bool]) -> None:
        """A preemption notice: checkpoint if chief, leave cleanly, hand over the role, replace."""
        import ray

        w.revoked_at = time.time()
        self.kernel.mark_revoked(w.worker_id)
        self.emitter.event("notice", worker_id=w.worker_id, server_id=w.server.server_id,
                           details=dict(notice, chief=w is self.chief))
        if w is self.chief and self.spec.checkpoint_every:
            checkpoint(w)
            if w.worker_id not in self.workers:  # it died while checkpointing: handled as a loss
                return
        ref = w.actor.leave.remote()
        try:
            ray.get(ref, timeout=5)
        except ray.exceptions.GetTimeoutError:
            self.detached.add(ref)  # still running when the actor is killed below: its failure is fetched later
        except Exception:  # noqa: BLE001 - the server is leaving anyway
            pass
        del self.workers[w.worker_id]
        self.emitter.end_server(w.server, "notice")
        with contextlib.suppress(Exception):
            ray.kill(w.actor)
        self._depart(w, self.kernel.lose(w.worker_id, time.time()))

    def _depart(self, w: WorkerHandle, decisions: list[Decision]) -> None:
        self.shards.set_num_workers(len(self.workers))
        self.shards.forget_worker(w.worker_id)
        lost = {"revoked_at": w.revoked_at, "worker_id": w.worker_id, "server_id": w.server.server_id,
                "speed_before": self._speed(), "step_at_loss": self._step()}
        self._execute(decisions, lost)

    # -- the kernel's decisions ------------------------------------------------------------------
    def _execute(self, decisions: list[Decision], lost: dict[str, Any] | None = None,
                 announce_chief: bool = True) -> None:
        for d in decisions:
            if isinstance(d, ChiefChange):
                self.chief = self.workers.get(d.chief) if d.chief is not None else None
                if announce_chief:
                    self.emitter.event("chief_change", worker_id=d.chief,
                                       details={"from": d.previous, "to": d.chief})
            elif isinstance(d, LrChange):
                self.shards.set_lr_scale(d.scale)
                self.emitter.event("lr_change", details={"policy": self.spec.lr_policy, "scale": d.scale,
                                                         "from": d.previous, "active_workers": d.active})
            elif isinstance(d, RequestReplacement):
                spare = self.pool.take(d.spec, time.time()) if self.pool is not None else None
                server = spare.server if spare is not None else self.provider.request(d.spec)
                self.pending.append((server, d.slot, lost or {}))  # a spare's: adopted by arrive()
                extra = {"replaces": (lost or {}).get("server_id"),
                         **(spare.details(time.time()) if spare is not None else {"warm": False})}
                if spare is None and self.provider.emulated:  # a real cluster's is known once the node is there
                    extra["startup_s"] = server.ready_at - server.requested_at
                self.emitter.server_event("replacement_requested", server, worker_id=d.replaces, extra=extra)
            elif isinstance(d, NoWorkersLeft):
                self.no_workers_left = True

    def release(self) -> None:
        """End every live worker's server and every warm spare's (the run is over)."""
        for w in list(self.workers.values()):
            if w.server.alive:
                self.emitter.end_server(w.server, "released")
        if self.pool is not None:
            self.pool.release()

    def kill_all(self) -> None:
        """Kill every worker actor and warm spare (at shutdown)."""
        import ray

        for w in [*self.workers.values(), *self.starting.values()]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(w.actor)
        if self.pool is not None:
            self.pool.kill_all()
