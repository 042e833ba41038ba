"""Nodes a run lost workers on, which its replacements keep off for a while (a real Ray cluster).

A worker lost by failure may have lost its node with it, and the GCS lists a dead node as alive until its health
checks have failed long enough; a replacement asked for meanwhile would be placed there, its creation cancelled
when the node is marked dead. :class:`LostNodes` has the provider keep replacements off such a node
(:meth:`~cmdare.cloud.ray_cluster.RayClusterProvider.avoid`, a label selector) and settles each: forgotten once
the GCS marks it dead (nothing is placed there then), or once it outlived the loss by
:data:`~cmdare.cloud.ray_cluster.AVOID_S` (its worker failed, not the node): replacements still waiting with
it avoided are then asked for again without.
"""

from __future__ import annotations

from collections.abc import Callable

from cmdare.cloud.local import ServerProvider
from cmdare.cloud.ray_cluster import AVOID_S, RayClusterProvider
from cmdare.train.runtime.cluster_health import node_state

__all__ = ["CHECK_EVERY_S", "LostNodes"]

CHECK_EVERY_S = 2.0  # how often the GCS is asked about the nodes replacements avoid


class LostNodes:
    """The nodes replacements avoid, kept by the provider of a real cluster (no-ops with any other provider)."""

    def __init__(self, provider: ServerProvider, state: Callable[[str], bool | None] = node_state,
                 avoid_s: float = AVOID_S):
        self.provider = provider if isinstance(provider, RayClusterProvider) else None
        self.state, self.avoid_s = state, avoid_s
        self._next_check = 0.0

    def avoided(self) -> tuple[str, ...]:
        """The nodes a worker asked for now keeps off (sorted)."""
        return tuple(sorted(self.provider.avoided)) if self.provider is not None else ()

    def lost(self, node_id: str | None, at: float) -> None:
        """The run lost a worker on ``node_id`` at ``at`` (wall time), by failure: its node may be dead. A node the
        GCS marked dead already is not avoided: nothing is placed there, and a replacement asks the autoscaler for
        a node with nothing but the resources it needs."""
        if self.provider is not None and node_id and self.state(node_id) is not False:
            self.provider.avoid(node_id, at)

    def settle(self, wall: float) -> list[str]:
        """Ask the GCS (every :data:`CHECK_EVERY_S`) about the avoided nodes: forget those it marked dead and those
        alive ``avoid_s`` after the loss; returns the latter (replacements that avoid them are to be asked again)."""
        if self.provider is None or not self.provider.avoided or wall < self._next_check:
            return []
        self._next_check = wall + CHECK_EVERY_S
        alive_after_loss = []
        for node_id, since in list(self.provider.avoided.items()):
            alive = self.state(node_id)
            if alive is False:
                self.provider.forget(node_id)
            elif alive and wall - since >= self.avoid_s:
                self.provider.forget(node_id)
                alive_after_loss.append(node_id)
        return alive_after_loss
