"""Starting or joining Ray, with Ray's failures mapped to :class:`~cmdare.errors.ClusterError`."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from cmdare.cloud.detection import INLINE_OBJECTS, LOCAL_RAY_CONFIG
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
    if address and address != "auto":
        _check_reachable(address)
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
                           "cmdare.train.cluster before Ray, with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER unset or 0")
    return ray
