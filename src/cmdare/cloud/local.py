"""Local server providers: where cmdare's servers come from when it runs on this machine.

A *server* hosts one worker or the parameter shards. Two local providers emulate a cloud:

* :class:`LocalProcessProvider` (one Ray node): a server is the worker process of one actor;
  revoking it kills that process (``ray.kill``).
* :class:`LocalClusterProvider` (``ray.cluster_utils.Cluster``): a server is a Ray node with its own
  raylet and a private scratch directory (its processes' ``CMDARE_HOME`` and ``CMDARE_SCRATCH``, as a
  VM has its own disk); revoking it removes the node, killing every process on it, and deletes the
  directory, as a cloud would.

Both sample each server's start-up delay (provisioning + staging + booting, from a startup model
the caller passes in, e.g. the one fitted on the CM-DARE data, divided by the time-compression
``speedup``) and record phase times.
On a real Ray cluster (``--address``), :class:`~cmdare.cloud.ray_cluster.RayClusterProvider` lets Ray's
autoscaler supply the servers.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cmdare.cloud.detection import WORKER_PRESTART_ENV
from cmdare.cloud.servers import ServerSpec
from cmdare.errors import UserInputError


@dataclass
class Server:
    """A server cmdare asked for: its spec, identity, phase times and, once ended, why."""

    server_id: str
    spec: ServerSpec
    requested_at: float
    ready_at: float  # when it can host an actor (requested_at + startup delay)
    phases_s: dict[str, float] = field(default_factory=dict)
    notice: tuple[str, str] | None = None  # (metadata URL, provider) its worker should watch
    joined_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    actor: Any = None  # the actor it hosts (set by the coordinator)
    node: Any = None  # the Ray node (cluster provider)
    scratch_dir: Path | None = None  # the node's private disk (cluster provider); gone with the node
    speedup: float = 1.0  # time compression of the emulated phases
    emulated: bool = False  # a local stand-in for a cloud VM (phases drawn from the startup model)
    cloud_requested_at: float | None = None  # emulated cloud time of the request (None: billed on the wall clock)
    cloud_ended_at: float | None = None
    cloud_clock: Callable[[], float] | None = field(default=None, repr=False)  # the run's emulated cloud time

    @property
    def alive(self) -> bool:
        return self.ended_at is None

    def end(self, reason: str, *, started: bool = True) -> None:
        """Mark it ended now (wall and cloud time), for ``reason``; not ``started``: given up before it started,
        so it ends at its request and bills nothing."""
        if started:
            self.ended_at = time.time()
            self.cloud_ended_at = self.cloud_clock() if self.cloud_clock is not None else None
        else:
            self.ended_at, self.cloud_ended_at = self.requested_at, self.cloud_requested_at
        self.end_reason = reason

    def uptime_s(self, now: float | None = None) -> float:
        """Wall seconds from its request to its end (or ``now``)."""
        end = self.ended_at if self.ended_at is not None else (now or time.time())
        return max(0.0, end - self.requested_at)

    def billed_s(self, cloud_now: float | None = None, now: float | None = None) -> float:
        """Seconds it is billed for: emulated cloud time from its request to its end (or ``cloud_now``) when the
        run emulates cloud time, so a seeded emulated run costs the same on a fast or a slow machine; else its
        wall uptime."""
        if self.cloud_requested_at is None:
            return self.uptime_s(now)
        end = self.cloud_ended_at if self.cloud_ended_at is not None else cloud_now
        return max(0.0, end - self.cloud_requested_at) if end is not None else 0.0

    def record(self) -> dict[str, Any]:
        """Fields for the store's servers table."""
        out = {"role": self.spec.role, "gpu_type": self.spec.gpu_type, "region": self.spec.region,
               "cloud": self.spec.cloud, "transient": self.spec.transient,
               "price_per_hour_usd": self.spec.price_per_hour_usd, "requested_at": self.requested_at,
               "emulated": self.emulated}
        for name, key in (("Provisioning", "provisioning_s"), ("Staging", "staging_s"), ("Booting", "booting_s")):
            if name in self.phases_s:
                out[key] = self.phases_s[name]
        if "Provisioning" in self.phases_s:  # phase ends on the (compressed) wall clock
            out["provisioned_at"] = self.requested_at + self.phases_s["Provisioning"] / self.speedup
            rest = self.phases_s.get("Staging", 0.0) + self.phases_s.get("Booting", 0.0)
            out["booted_at"] = out["provisioned_at"] + rest / self.speedup
        return out


class StartupSampler(Protocol):
    """A fitted startup model, e.g. :class:`cmdare.predict.startup.StartupModel`."""

    def sample(self, rng: np.random.Generator, gpu: str, transient: bool, region: str | None) -> dict[str, float]:
        """Phase name -> seconds for one server start."""


class StartupDelay:
    """Samples a server's start-up phases (seconds), compressed by ``speedup``.

    ``mode`` is ``"model"`` (draw from ``model``, e.g. CM-DARE startup data: lognormal per GPU type and
    transient flag) or a fixed number of seconds (``"0"`` for none). ``model`` is a fitted startup
    model or a zero-argument factory returning one (called on first use), such as
    :func:`cmdare.predict.startup_model`; it is only needed in ``"model"`` mode.
    """

    def __init__(self, mode: str = "model", speedup: float = 1.0, seed: int = 0,
                 model: StartupSampler | Callable[[], StartupSampler] | None = None):
        self.speedup = max(float(speedup), 1e-9)
        self.rng = np.random.default_rng(seed)
        self.fixed_s: float | None = None if mode == "model" else float(mode)
        self._source = model
        self._model: StartupSampler | None = None

    def _sampler(self) -> StartupSampler:
        if self._model is None:
            source = self._source
            if source is None:
                raise UserInputError('startup mode "model" needs a startup model: pass StartupDelay(..., '
                                     'model=cmdare.predict.startup_model), or a fixed delay in seconds')
            self._model = source if hasattr(source, "sample") else source()  # type: ignore[operator]
        return self._model

    def sample(self, spec: ServerSpec) -> dict[str, float]:
        if self.fixed_s is not None:
            return {"Provisioning": self.fixed_s}
        model = self._sampler()
        gpu = (spec.gpu_type or "cpu").lower()  # a parameter server: a CPU server's start-up
        try:
            return model.sample(self.rng, gpu, spec.transient, None)
        except Exception:  # noqa: BLE001 - a GPU without startup data: use K80's figures
            return model.sample(self.rng, "k80", spec.transient, None)

    def wall_s(self, phases: dict[str, float]) -> float:
        return sum(v for k, v in phases.items() if k != "Framework") / self.speedup


class ServerProvider(ABC):
    """Hands out servers, pins actors to them, and (for emulation) revokes them."""

    kind = "abstract"
    emulated = True  # its servers stand in for cloud VMs (every provider but a real Ray cluster's)

    def __init__(self, startup: StartupDelay | None = None):
        self.startup = startup or StartupDelay("0")
        self._ids = itertools.count()
        self.servers: list[Server] = []
        self.notices: dict[int, tuple[str, str]] = {}  # n-th worker server -> (metadata url, provider)
        self._worker_count = 0
        self.cloud_clock: Callable[[], float] | None = None  # emulated cloud time: its servers are billed in it

    def request(self, spec: ServerSpec) -> Server:
        """Ask for a server; it is usable from ``server.ready_at`` on."""
        n = next(self._ids)
        notice = None
        if spec.role == "worker":
            notice = self.notices.get(self._worker_count)
            self._worker_count += 1
        phases = self.startup.sample(spec) if spec.role in ("worker", "ps") else {}
        now = time.time()
        server = Server(f"{self.kind}-{spec.role}-{n}", spec, now, now + self.startup.wall_s(phases), phases,
                        notice=notice, speedup=self.startup.speedup, emulated=self.emulated)
        if self.cloud_clock is not None:
            server.cloud_clock, server.cloud_requested_at = self.cloud_clock, self.cloud_clock()
        self.servers.append(server)
        return server

    def prepare(self, server: Server, background: bool = False) -> None:  # noqa: B027 - optional hook
        """Make the server exist (e.g. start its Ray node) once its start-up delay has passed; ``background``:
        return at once where the provider can, the server coming up meanwhile (e.g. a warm spare's)."""

    @abstractmethod
    def actor_options(self, server: Server) -> dict[str, Any]:
        """Ray ``.options(...)`` that place an actor on ``server``."""

    @abstractmethod
    def revoke(self, server: Server) -> None:
        """Kill ``server`` abruptly (revocation emulation)."""

    def release(self, server: Server, reason: str = "released") -> None:
        """End ``server`` normally."""
        if server.alive:
            server.end(reason)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Let go of what the provider holds beyond the run's servers (at the run's end)."""


class LocalProcessProvider(ServerProvider):
    """One Ray node; each server is one actor's process."""

    kind = "local"

    def actor_options(self, server: Server) -> dict[str, Any]:
        return {}

    def revoke(self, server: Server) -> None:
        import ray

        if server.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(server.actor, no_restart=True)


class LocalClusterProvider(ServerProvider):
    """A multi-node local Ray cluster; each worker server is a Ray node of its own.

    Each worker node sees a private scratch directory under ``scratch_root`` (default: a new temporary
    directory) as its ``CMDARE_HOME`` and ``CMDARE_SCRATCH``; it is deleted when the node is revoked or
    released, so whatever a worker writes there is lost with its server, as on a cloud VM. Its raylet prestarts a
    worker process with torch and cmdare imported (:data:`~cmdare.cloud.detection.WORKER_PRESTART_ENV`).

    A node takes about a second to start (its raylet and agents), and its prestarted process another to import
    torch (several on a loaded machine). The first nodes start one by one before training (nothing trains yet);
    a replacement's node, and a warm spare's, starts on a background thread (``prepare(server, background=True)``,
    and every node once a server has been revoked): the coordinator goes on feeding the surviving workers, and Ray
    places the server's actor (which asks for the node's own resource) as soon as the node registers. Revoking or
    releasing a server whose node is still starting waits for the start, then removes the node.

    ``ready_nodes``: how many idle nodes, their processes prestarted, the provider keeps for the servers asked for
    in the background (replacements, warm spares: each takes the oldest; another starts in its place); the first
    wave, started in the foreground, starts nodes of its own. A local node stands for a cloud VM whose start-up
    is emulated (the ``startup`` delay, ``'0'``: none); the local node's own start and its process's imports are
    then no part of the emulated start-up, and a ready node keeps them out of it. Idle nodes are no servers: they
    bill nothing; :meth:`close` removes them.
    """

    kind = "node"

    def __init__(self, cluster: Any, startup: StartupDelay | None = None, cpus_per_node: int = 1,
                 scratch_root: str | Path | None = None, ready_nodes: int = 0):
        super().__init__(startup)
        if isinstance(ready_nodes, bool) or not isinstance(ready_nodes, int) or ready_nodes < 0:
            raise UserInputError(f"ready_nodes must be a whole number >= 0, got {ready_nodes!r}")
        self.cluster = cluster
        self.cpus_per_node = cpus_per_node
        self.ready_nodes = ready_nodes
        self.scratch_root = Path(scratch_root) if scratch_root else Path(tempfile.mkdtemp(prefix="cmdare-nodes-"))
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cmdare-node-start")
        self._starting: dict[str, Future] = {}
        self._background = False  # set by the first revocation: replacements then start in the background
        self._node_ids = itertools.count()
        self._idle: list[_LocalNode] = []  # the ready nodes, oldest first (up or starting)
        self._resources: dict[str, str] = {}  # server id -> its node's resource

    def _resource(self, server: Server) -> str:
        return self._resources[server.server_id]

    def _start_node(self) -> _LocalNode:
        """A new worker node, started on the provider's thread (nodes start one at a time)."""
        i = next(self._node_ids)
        resource, disk = f"cmdare_node_{i}", self.scratch_root / f"node-{i}"
        disk.mkdir(parents=True, exist_ok=True)
        future = self._starter.submit(
            _start_worker_node, self.cluster, num_cpus=self.cpus_per_node, node_ip_address="127.0.0.1",
            resources={resource: 1}, env_vars={"CMDARE_HOME": str(disk), "CMDARE_SCRATCH": str(disk),
                                               **WORKER_PRESTART_ENV})
        return _LocalNode(resource, disk, future)

    def fill(self) -> None:
        """Start nodes until :attr:`ready_nodes` idle ones are up or starting."""
        while len(self._idle) < self.ready_nodes:
            self._idle.append(self._start_node())

    def prepare(self, server: Server, background: bool = False) -> None:
        if server.spec.role == "worker" and server.node is None and server.server_id not in self._starting:
            # the first wave (started in the foreground) starts nodes of its own: the ready ones, started beside
            # it, have imported torch by the time training loads the machine and a replacement needs one
            later = background or self._background
            node = self._idle.pop(0) if self._idle and later else self._start_node()
            self._resources[server.server_id], server.scratch_dir = node.resource, node.disk
            self._starting[server.server_id] = node.future
            if not later:
                server.node = self._starting.pop(server.server_id).result()  # a failed start raises here
            self.fill()

    def _node(self, server: Server) -> Any:
        """The server's node, waiting for it if it is still starting (None if it never started)."""
        future = self._starting.pop(server.server_id, None)
        if future is not None:
            with contextlib.suppress(Exception):  # being removed anyway: a failed start leaves nothing
                server.node = future.result()
        return server.node

    def actor_options(self, server: Server) -> dict[str, Any]:
        if server.spec.role != "worker":
            return {"resources": {"cmdare_ps": 0.01}} if _has_resource("cmdare_ps") else {}
        return {"resources": {self._resource(server): 1}}

    def revoke(self, server: Server) -> None:
        self._background = True
        node = self._node(server)
        if node is not None:
            with contextlib.suppress(Exception):
                self.cluster.remove_node(node, allow_graceful=False)
        _wipe(server)

    def release(self, server: Server, reason: str = "released") -> None:
        super().release(server, reason)
        node = self._node(server)
        if node is not None:
            with contextlib.suppress(Exception):
                self.cluster.remove_node(node)
            server.node = None
        _wipe(server)

    def close(self) -> None:
        """Remove the idle ready nodes (a run's servers are released by the run)."""
        idle, self._idle, self.ready_nodes = self._idle, [], 0
        for node in idle:
            with contextlib.suppress(Exception):  # a failed start leaves nothing to remove
                self.cluster.remove_node(node.future.result())
            shutil.rmtree(node.disk, ignore_errors=True)


@dataclass
class _LocalNode:
    """A worker node of a local cluster: the resource that pins actors to it, its private disk, its start."""

    resource: str
    disk: Path
    future: Future


def _wipe(server: Server) -> None:
    """Delete a node's private disk: what its processes wrote there ends with the server."""
    if server.scratch_dir is not None:
        shutil.rmtree(server.scratch_dir, ignore_errors=True)


def _start_worker_node(cluster: Any, **node_args: Any) -> Any:
    """``cluster.add_node(wait=False, **node_args)`` that may run off the main thread.

    Ray's ``add_node`` registers a SIGTERM handler for the node, which only the main thread may do;
    this starts the same worker node without that exit hook (``Cluster.remove_node`` and
    ``Cluster.shutdown`` still stop it, and its raylet exits when the cluster's GCS goes away).
    """
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(**node_args)
    params.update_if_absent(num_cpus=1, num_gpus=0, object_store_memory=150 * 1024 * 1024, min_worker_port=0,
                            max_worker_port=0, redis_address=cluster.redis_address,
                            gcs_address=cluster.gcs_address, include_log_monitor=False, node_manager_port=0)
    params.dashboard_agent_listen_port = None
    node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    cluster.worker_nodes.add(node)
    return node


def _has_resource(name: str) -> bool:
    import ray

    return name in ray.cluster_resources()
