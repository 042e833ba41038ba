"""Warm spares: worker processes started before they are needed, so a replacement skips the cold start.

A cold replacement is a server start plus a fresh Python process that imports torch and cmdare, reads
the data and builds the model before its first pull. With ``TrainSpec.warm_spares = N`` the run keeps N
standby servers, each with a :class:`StandbyWorker` whose process has done all of that (and one forward
and backward pass) but is no member of the run: no data slot, no shards, no synchronous barrier. When the
controller has a replacement take a standby (``StartWorker(spare=K)``), the executor takes it
(:meth:`WarmPool.take`): its server becomes the replacement's server, :meth:`StandbyWorker.adopt` makes
its process the worker and pulls the parameters. A standby is billed from its request, idle or not, as a cloud
bills a running VM.

Locally (:class:`~cmdare.cloud.local.LocalClusterProvider`) a standby gets its own Ray node; on a real
cluster it is an actor asking for the worker resources, so the autoscaler brings a node for it. The pool decides
nothing: how many standbys, which one a replacement takes, when another is asked for and when to give up are
the controller's (:mod:`cmdare.control.spares`); the pool starts them (``StartSpare``) and reports ``SpareUp`` and
``SpareLost``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.cloud.servers import ServerSpec
from cmdare.control import run_events as E
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.worker import Worker, ray_node_id

__all__ = ["Standby", "StandbyWorker", "WarmPool", "actor_class", "measured_start", "startup_timings",
           "worker_threads"]

STANDBY_PING_S = 2.0  # how often a ready standby is asked whether it is still there
BUFFERS_EVERY_S = 2.0  # how often the chief's batch-norm statistics are copied for the next replacement


@functools.cache
def actor_class(cls: type) -> Any:
    """``ray.remote(cls)``, made once: Ray exports an actor class once per cluster and job, not per actor."""
    import ray

    return ray.remote(cls)


def worker_threads(spec: TrainSpec) -> int | None:
    """torch threads of a worker process: its CPU request, at least one (None: torch's default)."""
    return max(1, int(spec.cpus_per_worker)) if spec.cpus_per_worker else None


class StandbyWorker(Worker):
    """A worker process before it is a worker: torch and cmdare imported, the data read, the model of the
    run's kind built and one training step's forward and backward run (the process's first-call costs),
    then idle. :meth:`adopt` makes it the worker ``Worker(*args)`` would be."""

    def __init__(self, spec: TrainSpec, threads: int | None = None):  # the member's part runs in adopt()
        self.init_at = time.time()  # torch and cmdare imported (by a prestarted process, before it was placed)
        self._build(spec, threads)
        x, y = next(self.task.stream(0, 1, spec.batch_size, spec.seed))
        with self.forward_precision():  # the kernels of the run's precision
            loss = self.task.loss_of(self.model(x.to(self.device)), y.to(self.device))
        loss.backward()
        self.model.zero_grad(set_to_none=True)
        self.step, self.watchers, self.pull_first = -1, [], False
        self.channels, self.same_node, self.pieces = {}, set(), None  # as before a first layout (leave() closes them)
        self.node_id, self.started_at = ray_node_id(), time.time()

    def standby_ready(self) -> tuple[str | None, float, dict[str, float]]:
        """:meth:`ready`, and when its ``__init__`` began (after placement and the imports: the phases of its start)."""
        return self.node_id, self.started_at, {"init_at": self.init_at}

    def adopt(self, *args: Any) -> dict[str, Any]:
        """Become the member ``Worker(*args)`` would be (its slot, shards and placement; the data and model
        this process built are kept) and pull the parameters; returns when it was up and the times."""
        t0 = time.perf_counter()
        worker_id, slot, num_slots, spec, shards, placement, _threads, start_step, notice, stretch = args
        self.spec = spec
        self._join(worker_id, slot, num_slots, shards, placement, start_step, notice, stretch)
        t1 = time.perf_counter()
        self.pull()
        # synchronous: the survivors' rounds go on until the round grows to count this worker, so the parameters
        # pulled here may be a round old by its first step (a push on them would be stale in a lockstep round)
        self.pull_first = bool(spec.sync)
        return {"node_id": self.node_id, "up_at": self.started_at, "adopt_init_s": t1 - t0,
                "first_pull_s": time.perf_counter() - t1}


def startup_timings(ref: Any) -> dict[str, Any]:
    """A replacement's start-up figures from its ``ready()`` or ``adopt()`` result (already computed by
    the time its first chunk returns): ``worker_up_at`` and, for a warm one, ``adopt_init_s`` and
    ``first_pull_s``. Empty when unknown."""
    import ray

    if ref is None:
        return {}
    try:
        got = ray.get(ref, timeout=1.0)
    except Exception:  # noqa: BLE001 - figures only: a worker that died has none
        return {}
    if isinstance(got, dict):
        return {"worker_up_at": got["up_at"], **{k: got[k] for k in ("adopt_init_s", "first_pull_s")}}
    return {"worker_up_at": got[1]}


def measured_start(server: Server, node_id: str | None, up_at: float) -> tuple[float, float | None]:
    """Record a real cluster's server start: request -> node registered with the GCS (Provisioning) ->
    worker process up (Booting). Sets the phases and ``ready_at``; returns the start-up in seconds and
    when the node registered (None if the GCS did not say: the phases are then left unknown)."""
    from cmdare.cloud.ray_cluster import node_started_at

    registered = node_started_at(node_id)
    server.ready_at = up_at
    if registered is None:  # the GCS did not say when the node came: the split is unknown, not zero
        server.phases_s = {}
        return up_at - server.requested_at, None
    # a node that was already there (an idle one, or one the autoscaler had launched on its own to keep
    # the type's minimum) took no provisioning time for this request
    node_at = min(max(server.requested_at, registered), up_at)
    server.phases_s = {"Provisioning": node_at - server.requested_at, "Booting": max(0.0, up_at - node_at)}
    return up_at - server.requested_at, registered


@dataclass
class Standby:
    """The controller's spare ``key``: a standby server and its process (``actor`` None until its emulated
    start-up delay has passed)."""

    key: int
    server: Server
    actor: Any = None
    ready_ref: Any = None
    up_at: float | None = None  # when its process was warm (None: still starting)
    ping: Any = None

    def details(self, now: float) -> dict[str, Any]:
        """What a replacement request that takes it reports: warm already (it starts nothing, idle since
        ``up_at``), its process still starting, or its server not there yet."""
        if self.actor is None:
            return {"warm": True, "spare": "server"}
        if self.up_at is None:
            return {"warm": True, "spare": "starting"}
        return {"warm": True, "spare": "up", "startup_s": 0.0, "standby_idle_s": max(0.0, now - self.up_at)}


class WarmPool:
    """The standby workers the controller asked for: started, taken, released; their start and loss reported.

    Args:
        options: the Ray actor options of a worker on a server (resources, GPUs, placement).
    """

    def __init__(self, spec: TrainSpec, provider: ServerProvider, emitter: RunEmitter,
                 detached: DetachedCalls, options: Callable[[Server], dict[str, Any]],
                 launch: Callable[[Server], Any] | None = None):
        self.spec, self.provider, self.emitter = spec, provider, emitter
        self.detached, self.options = detached, options
        self.launch = launch or self._standby_worker  # a standby process on a server (an all-reduce run's: a member)
        self.standbys: list[Standby] = []
        self.actors: list[Any] = []  # every process the pool started (killed at teardown)
        self.closed = False
        self._events: list[E.Event] = []  # what the controller has not heard yet
        self._next_ping = 0.0
        # The chief's batch-norm statistics, copied every few seconds: a replacement starts from them at once
        # instead of waiting for the chief's chunk in flight to end (the chief answers between chunks).
        self.buffers: dict[str, Any] | None = None
        self._buffers_ref: Any = None
        self._next_buffers = 0.0

    def request(self, key: int, server_spec: ServerSpec, first_wave: bool, wall: float) -> list[E.Event]:
        """Ask for spare ``key``'s server (with the first wave: its start-up, like the first wave's, is no part of
        the run); its process is started by :meth:`tick` once the server is there."""
        server = self.provider.request(server_spec)
        if first_wave:
            server.ready_at = server.requested_at
        standby = Standby(key, server)
        self.standbys.append(standby)
        self.emitter.server_event("standby_requested", server, extra={"standby": True, "spare": key})
        if first_wave:  # its start overlaps the first wave's, before training loads the machine
            self._launch(standby)
        startup_s = max(0.0, server.ready_at - server.requested_at) if self.provider.emulated else None
        return [E.ServerStarting(wall=wall, spare=key, startup_s=startup_s)]

    def _launch(self, s: Standby) -> None:
        """Start the standby's server (a node, locally, on the provider's thread) and its process."""
        self.provider.prepare(s.server, background=True)
        s.actor = self.launch(s.server)
        s.server.actor = s.actor
        s.ready_ref = s.actor.standby_ready.remote()
        self.actors.append(s.actor)

    def _standby_worker(self, server: Server) -> Any:
        return actor_class(StandbyWorker).options(**self.options(server)).remote(self.spec, worker_threads(self.spec))

    def reports(self) -> list[E.Event]:
        """What the controller is to hear since the last call: ``SpareUp``, ``SpareLost``."""
        events, self._events = self._events, []
        return events

    def tick(self, now: float, source: Any = None) -> None:
        """Launch standbys whose (emulated) start-up has passed, note those that came up, find lost ones
        (:meth:`reports` tells the controller); copy the batch-norm statistics of the ``source`` worker (an actor
        that trained; None: keep the last)."""
        import ray

        self._copy_buffers(now, source)
        # Every standby whose server is due starts now, in parallel: the pool keeps pace with losses only if a
        # spare taken is replaced at once (a worker node's processes are prestarted with torch imported, so a
        # standby's own start is its data, model and first step).
        for s in [s for s in self.standbys if s.actor is None and s.server.ready_at <= now]:
            self._launch(s)
        waiting = {s.ready_ref: s for s in self.standbys if s.up_at is None and s.ready_ref is not None}
        if waiting:
            done, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
            for ref in done:
                self._up(waiting[ref])
        if now < self._next_ping:
            return
        self._next_ping = now + STANDBY_PING_S
        for s in [s for s in self.standbys if s.up_at is not None]:
            if s.ping is not None:
                if not ray.wait([s.ping], timeout=0)[0]:
                    continue  # asked a moment ago: not answered yet
                try:
                    ray.get(s.ping)
                except Exception as err:  # noqa: BLE001 - its node or process is gone
                    self._lost(s, err)
                    continue
            s.ping = s.actor.ping.remote()

    def _copy_buffers(self, now: float, source: Any) -> None:
        import ray

        ref = self._buffers_ref
        if ref is not None and ray.wait([ref], timeout=0)[0]:
            self._buffers_ref = None
            with contextlib.suppress(Exception):  # the source died meanwhile: the next one is asked
                self.buffers = ray.get(ref)
        if self._buffers_ref is None and source is not None and now >= self._next_buffers:
            self._buffers_ref, self._next_buffers = source.buffers.remote(), now + BUFFERS_EVERY_S

    def _up(self, s: Standby) -> None:
        import ray

        try:
            node_id, up_at, phases = ray.get(s.ready_ref)
        except Exception as err:  # noqa: BLE001 - its node or process died before it was warm
            self._lost(s, err)
            return
        s.up_at = up_at
        self._events.append(E.SpareUp(wall=time.time(), key=s.key))
        emulated = self.provider.emulated
        startup, registered = ((up_at - s.server.requested_at, None) if emulated
                               else measured_start(s.server, node_id, up_at))
        self.emitter.server_event("standby_ready", s.server, extra={"node_id": node_id, "startup_s": startup,
                                                                     "node_registered_at": registered, "up_at": up_at,
                                                                     **phases})

    def _lost(self, s: Standby, err: Exception) -> None:
        """A standby died (its server went away, or its process): end it (the controller decides on another)."""
        import ray

        self.standbys.remove(s)
        with contextlib.suppress(Exception):
            ray.kill(s.actor)
        self.emitter.event("standby_lost", server_id=s.server.server_id,
                           details={"error": type(err).__name__, "warm": s.up_at is not None})
        self.emitter.end_server(s.server, "standby_lost")
        self.provider.release(s.server, "standby_lost")
        self._events.append(E.SpareLost(wall=time.time(), key=s.key, error=type(err).__name__))

    def close(self, failed_starts: int) -> None:
        """The controller asks for no more standbys (``failed_starts`` in a row died before they were up)."""
        self.closed = True
        self.emitter.event("warm_pool_closed", details={"failed_starts": failed_starts})

    def take(self, key: int) -> Standby | None:
        """Spare ``key`` for a replacement (None: it died meanwhile, before the controller heard: a cold start)."""
        s = next((s for s in self.standbys if s.key == key), None)
        if s is None:
            return None
        self.standbys.remove(s)
        if s.ping is not None:
            self.detached.add(s.ping)
        return s

    def release(self) -> None:
        """The run is over: end every standby's server (one that never came up on a real cluster bills
        nothing, as a replacement withdrawn while waiting for its node)."""
        self.closed = True
        if self._buffers_ref is not None:
            self.detached.add(self._buffers_ref)
        for s in self.standbys:
            self.detached.add(*(r for r in (s.ready_ref, s.ping) if r is not None))
            if s.up_at is None and not self.provider.emulated and s.server.alive:
                s.server.end("not_started", started=False)
            self.emitter.end_server(s.server, s.server.end_reason or "released")
        self.standbys = []

    def kill_all(self) -> None:
        """Kill every process the pool started (at shutdown; adopted ones are the run's workers)."""
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor)
