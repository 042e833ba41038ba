"""Servers of a real Ray cluster (``--address``): Ray's autoscaler supplies them, nothing is emulated.

A worker server is a pending worker actor whose resources (:data:`~cmdare.cloud.servers.WORKER_RESOURCE`,
the GPU type's :func:`~cmdare.cloud.servers.gpu_resource` where the cluster's nodes carry it, ``num_gpus``)
the autoscaler satisfies by launching a node. Its start-up is what the cluster does: the coordinator
records when the replacement was requested, when its node registered with the GCS (:func:`node_started_at`)
and when its worker process was up; no start-up delay is sampled.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from cmdare.cloud.local import LocalProcessProvider, Server, ServerProvider, StartupDelay
from cmdare.cloud.servers import GPU_RESOURCE_PREFIX, PS_RESOURCE, WORKER_RESOURCE, gpu_resource

NODE_INFO_TRIES = 3  # lookups of a node's registration before it is left unknown (the GCS busy a moment)

__all__ = ["RayClusterProvider", "node_started_at"]


class RayClusterProvider(ServerProvider):
    """A real Ray cluster: workers go to nodes with ``cmdare_worker`` (and their GPU type's resource when
    the cluster's nodes carry one), shards to ``cmdare_ps`` nodes.

    Which resources a worker asks for is settled when the first worker is placed (from the resources the
    cluster has then) and kept for replacements: once every worker node is gone, the cluster no longer
    lists ``cmdare_worker``, but a replacement must still wait for a worker node, not land on the head.
    """

    kind = "ray"
    emulated = False

    def __init__(self, startup: StartupDelay | None = None):
        super().__init__(StartupDelay("0"))  # a real cluster: start-up is measured, never sampled
        self._worker_keys: tuple[bool, bool] | None = None  # (cmdare_worker present, GPU-type resources)
        self._ps_key: bool | None = None

    def actor_options(self, server: Server) -> dict[str, Any]:
        import ray

        if server.spec.role != "worker":
            if self._ps_key is None:
                self._ps_key = PS_RESOURCE in ray.cluster_resources()
            return {"resources": {PS_RESOURCE: 1}} if self._ps_key else {}
        if self._worker_keys is None:
            names = set(ray.cluster_resources())
            self._worker_keys = (WORKER_RESOURCE in names, any(n.startswith(GPU_RESOURCE_PREFIX) for n in names))
        has_worker, typed = self._worker_keys
        resources = {WORKER_RESOURCE: 1} if has_worker else {}
        if typed and server.spec.gpu_type:
            resources[gpu_resource(server.spec.gpu_type)] = 1
        return {"resources": resources} if resources else {}

    def revoke(self, server: Server) -> None:
        LocalProcessProvider.revoke(self, server)  # type: ignore[arg-type]


def node_started_at(node_id: str | None) -> float | None:
    """When the node registered with the GCS (epoch seconds), or None if unknown."""
    if not node_id:
        return None
    for attempt in range(NODE_INFO_TRIES):
        with contextlib.suppress(Exception):  # an older Ray, or the GCS unreachable for a moment
            import ray

            for nid, info in ray._private.worker.global_worker.gcs_client.get_all_node_info().items():
                if nid.hex() == node_id and info.start_time_ms:
                    return info.start_time_ms / 1000.0
        if attempt + 1 < NODE_INFO_TRIES:
            time.sleep(0.2)
    return None
