"""Starting or joining Ray, with Ray's failures mapped to :class:`~cmdare.errors.ClusterError`."""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cmdare.cloud.detection import INLINE_OBJECTS, LOCAL_RAY_CONFIG
from cmdare.cloud.servers import (
    CMDARE_RESOURCE_PREFIX,
    GPU_RESOURCE_PREFIX,
    HEAD_RESOURCE,
    PS_RESOURCE,
    WORKER_RESOURCE,
)
from cmdare.errors import ClusterError

# A local multi-node cluster rewrites 127.0.0.1 to the machine's address unless this is set
# before Ray is imported (see docs/design notes, pitfalls).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

LOOPBACK = "127.0.0.1"


def ensure_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Connect to Ray: reuse a running session, join ``address``, or start a local one.

    Returns True when this call started Ray (the caller then shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    target = _auto_address() if address == "auto" else address
    if target:
        _check_reachable(target)
    common = {"logging_level": logging.ERROR, "log_to_driver": False, "include_dashboard": False}
    try:
        if address:
            ray.init(address=address, **common)
        else:
            # address="local": always a new local instance, even when another Ray runs on this machine
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, _node_ip_address="127.0.0.1",
                     _system_config=LOCAL_RAY_CONFIG, **common)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ClusterError(f"cannot connect to {where}: {first}") from err
    return True


@dataclass(frozen=True)
class JoinedCluster:
    """What a joined Ray cluster holds: its alive nodes by cmdare role, CPUs and GPUs."""

    address: str
    nodes: int
    cpus: float
    gpus: float
    roles: Mapping[str, int] = field(default_factory=dict)  # "head", "parameter server", "k80 worker", ...

    @property
    def is_cmdare(self) -> bool:
        """Whether any node offers a resource of cmdare's cluster configs (``cmdare_*``)."""
        return bool(self.roles)

    def describe(self) -> str:
        """``'127.0.0.1:6379: 4 nodes (1 head, 1 parameter server, 2 k80 workers), 8 CPUs, 2 GPUs'``."""
        roles = ", ".join(f"{n} {role}{'s' * (n != 1)}" for role, n in self.roles.items())
        return (f"{self.address}: {self.nodes} node{'s' * (self.nodes != 1)}{f' ({roles})' if roles else ''}, "
                f"{self.cpus:g} CPU{'s' * (self.cpus != 1)}, {self.gpus:g} GPU{'s' * (self.gpus != 1)}")


_ROLE_ORDER = {"head": 0, "parameter server": 1}


def node_role(resources: Iterable[str]) -> str | None:
    """A node's cmdare role from its resource names, or None for a node no cmdare config made."""
    names = set(resources)
    gpus = sorted(n[len(GPU_RESOURCE_PREFIX):] for n in names if n.startswith(GPU_RESOURCE_PREFIX))
    if WORKER_RESOURCE in names or gpus:
        return "+".join(gpus) + " worker" if gpus else "worker"
    if PS_RESOURCE in names:
        return "parameter server"
    if HEAD_RESOURCE in names:
        return "head"
    return "other" if any(n.startswith(CMDARE_RESOURCE_PREFIX) for n in names) else None


def joined_cluster(nodes: Iterable[Mapping[str, Any]], address: str) -> JoinedCluster:
    """Describe a cluster from ``ray.nodes()`` (alive nodes only)."""
    alive = [n for n in nodes if n.get("Alive")]
    roles = Counter(r for n in alive if (r := node_role(n.get("Resources", {}))) is not None)
    return JoinedCluster(address, len(alive), sum(n.get("Resources", {}).get("CPU", 0.0) for n in alive),
                         sum(n.get("Resources", {}).get("GPU", 0.0) for n in alive),
                         dict(sorted(roles.items(), key=lambda kv: (_ROLE_ORDER.get(kv[0], 2), kv[0]))))


def check_joined(address: str, any_cluster: bool = False) -> JoinedCluster:
    """The cluster Ray joined for ``--address``; refuses one no cmdare config started unless ``any_cluster``.

    A cluster that is not cmdare's has no node for a worker's ``cmdare_worker`` resource (or its workers
    land anywhere): refusing it here is one line instead of a training run that waits or dies later.
    """
    import ray

    gcs = ray.get_runtime_context().gcs_address or address
    info = joined_cluster(ray.nodes(), gcs)
    if not info.is_cmdare and not any_cluster:
        raise ClusterError(
            f"the Ray cluster at {info.describe()} was not started by cmdare (no node offers {WORKER_RESOURCE}, "
            f"{PS_RESOURCE} or {HEAD_RESOURCE}): start one from 'cmdare cluster-config' (docs/cluster.md), "
            "or pass --any-cluster to train on it anyway")
    return info


def _auto_address() -> str | None:
    """The cluster ``--address auto`` names (``RAY_ADDRESS``, or the one ``ray start`` left on this machine)."""
    try:
        from ray._private.services import get_ray_address_from_environment

        return get_ray_address_from_environment("auto", None)
    except Exception:  # noqa: BLE001 -- no cluster, or another Ray: ray.init reports it
        return None


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast when the GCS port does not answer (``ray.init`` would retry for minutes)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--address must be 'auto' or HOST:PORT, got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {err.strerror or err}") from err


def start_local_ray(num_cpus: int | None = None, **options: Any) -> Any:
    """Start a new private local Ray instance on 127.0.0.1 for a script (the benchmarks); returns ``ray``.

    ``ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
    logging_level=ERROR, _system_config=INLINE_OBJECTS)``, ``options`` overriding or adding to these. Import
    this module before anything imports Ray. Unlike :func:`ensure_ray`: always a new instance, Ray's own
    failure-detection settings, Ray's errors as raised.
    """
    ray = _loopback_ray()
    ray.init(**{"address": "local", "num_cpus": num_cpus, "_node_ip_address": LOOPBACK, "include_dashboard": False,
                "log_to_driver": False, "logging_level": logging.ERROR, "_system_config": dict(INLINE_OBJECTS),
                **options})
    return ray


def start_local_cluster(**head_node_args: Any) -> Any:
    """A multi-node ``ray.cluster_utils.Cluster`` on 127.0.0.1 (head node only) with this process connected
    as its driver; the caller calls ``ray.shutdown()`` and then ``cluster.shutdown()``."""
    ray = _loopback_ray()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"node_ip_address": LOOPBACK, "include_dashboard": False,
                                                             **head_node_args})
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def _loopback_ray() -> Any:
    """``ray``, after checking it will keep 127.0.0.1 (it reads the variable above when imported)."""
    import ray

    try:
        from ray._private import ray_constants
    except ImportError:  # a Ray without this module: nothing to check
        return ray
    if getattr(ray_constants, "ENABLE_RAY_CLUSTER", False):
        raise ClusterError("Ray would run on this machine's network address, not 127.0.0.1: import "
                           "cmdare.train.run.ray_session before Ray, with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER unset or 0")
    return ray
