"""Servers of a real Ray cluster (``--address``): Ray's autoscaler supplies them, nothing is emulated.

A worker server is a pending worker actor whose resources (:data:`~cmdare.cloud.servers.WORKER_RESOURCE`,
the GPU type's :func:`~cmdare.cloud.servers.gpu_resource` where the cluster's nodes carry it, ``num_gpus``)
the autoscaler satisfies by launching a node. Its start-up is what the cluster does: the coordinator
records when the replacement was requested, when its node registered with the GCS (:func:`node_started_at`)
and when its worker process was up; no start-up delay is sampled.

A worker lost by failure may have lost its node with it, and the GCS goes on listing a dead node as alive
until its health checks have failed long enough (seconds on a cloud); meanwhile it would place the
replacement there (room is free on it once the lost worker's actor is killed), then cancel the creation when
it marks the node dead. So a replacement avoids the nodes the run has just lost workers on
(:meth:`RayClusterProvider.avoid`): Ray's label selector on the label every node carries, ``ray.io/node-id``
(``{"ray.io/node-id": "!ID"}``; ``NodeAffinitySchedulingStrategy`` can only ask *for* a node). An avoided node
is forgotten once the GCS marks it dead (it places nothing there then) or once it outlived the loss by
:data:`AVOID_S` (then it was the worker that failed, not its node).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from typing import Any

from cmdare.cloud.local import LocalProcessProvider, Server, ServerProvider, StartupDelay
from cmdare.cloud.servers import GPU_RESOURCE_PREFIX, PS_RESOURCE, WORKER_RESOURCE, gpu_resource

NODE_INFO_TRIES = 3  # lookups of a node's registration before it is left unknown (the GCS busy a moment)
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id (hex)
AVOID_S = 60.0  # a lost worker's node still alive to the GCS this long after the loss was not lost with it

__all__ = ["AVOID_S", "NODE_ID_LABEL", "RayClusterProvider", "label_selectors", "node_started_at"]


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
        self.avoided: dict[str, float] = {}  # node id (hex) -> when the run lost a worker on it (wall time)

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
        options: dict[str, Any] = {"resources": resources} if resources else {}
        selector = self.selector()
        if selector:
            options["label_selector"] = selector
        return options

    def avoid(self, node_id: str | None, since: float) -> None:
        """Place no worker on node ``node_id`` (the run lost a worker on it at ``since``) until :meth:`forget`."""
        if node_id and label_selectors():
            self.avoided.setdefault(node_id, since)

    def forget(self, node_id: str) -> None:
        """Node ``node_id`` may host workers again (the GCS marked it dead, or it outlived the loss)."""
        self.avoided.pop(node_id, None)

    def selector(self) -> dict[str, str]:
        """The label selector that keeps a worker off the avoided nodes (empty: none avoided)."""
        ids = sorted(self.avoided)
        if not ids:
            return {}
        return {NODE_ID_LABEL: f"!{ids[0]}" if len(ids) == 1 else f"!in({','.join(ids)})"}

    def revoke(self, server: Server) -> None:
        LocalProcessProvider.revoke(self, server)  # type: ignore[arg-type]


@functools.cache
def label_selectors() -> bool:
    """Whether this Ray places actors by a node label selector (the ``label_selector`` option; Ray 2.60 has it)."""
    for module in ("ray._common.ray_option_utils", "ray._private.ray_option_utils"):
        with contextlib.suppress(ImportError, AttributeError):
            return "label_selector" in importlib.import_module(module).actor_options
    return False


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
