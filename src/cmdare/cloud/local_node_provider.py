"""The node provider of a local cluster: Ray's fake multi-node provider, where a node that died is gone.

Ray's ``FakeMultiNodeProvider`` lists a node it launched until the autoscaler terminates it, and the
autoscaler terminates only nodes that are "up-to-date", which the fake provider's nodes never become (they
run no node updaters). A killed node (a VM revoked without notice) therefore stayed listed for good with the
resources it last reported, and the autoscaler could count room on it for the very replacement the node's
death asked for, and launch nothing. A cloud's API lists a revoked VM as terminated; this provider does the
same once the node's raylet has exited, so the autoscaler forgets the node and launches its replacement.

The autoscaler (Ray's monitor process on the head) loads this class by its import path
(``provider: {type: external, module: ...}``); nothing else in cmdare imports it.
"""

from __future__ import annotations

from typing import Any

from ray._private import ray_constants
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

__all__ = ["LocalNodeProvider"]


class LocalNodeProvider(FakeMultiNodeProvider):
    """Ray's fake multi-node provider that drops a node once its raylet exited (as a cloud drops a dead VM)."""

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        with self.lock:
            for node_id in [n for n, entry in self._nodes.items() if _raylet_exited(entry)]:
                entry = self._nodes.pop(node_id)
                # the rest of the "VM" goes with it: a node's agents or workers left running are killed
                entry["node"].kill_all_processes(check_alive=False, allow_graceful=False)
        return super().non_terminated_nodes(tag_filters)


def _raylet_exited(entry: dict[str, Any]) -> bool:
    node = entry.get("node")  # None for the head, which the provider did not start
    if node is None:
        return False
    raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, [])
    return bool(raylets) and all(info.process.poll() is not None for info in raylets)
