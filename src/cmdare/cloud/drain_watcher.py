""":class:`DrainWatcher`: Ray's preemption drain of this node, seen as a preemption notice.

When a cloud preempts a spot node of a Ray cluster, autoscaler v2 and KubeRay drain it first: the GCS
marks the node draining with reason ``DRAIN_NODE_REASON_PREEMPTION`` and a deadline (``ray drain-node
--reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N`` does the same by hand; Ray also
drains a node whose raylet receives SIGTERM). The GCS lists draining nodes with their deadlines, not
their reasons; a drain for idleness is rejected by a node that runs a worker (the worker keeps it busy),
so a drain of a worker's node is a preemption. The watcher polls that list for its own node in a daemon
thread and exposes the first drain as a :class:`~cmdare.cloud.notice_protocol.Notice` with provider
``'ray'``, like the GCE and EC2 metadata watchers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cmdare.cloud.notice_protocol import Notice
from cmdare.errors import UserInputError

__all__ = ["DRAIN_PROVIDER", "DrainWatcher", "drain_deadline", "draining_nodes"]

log = logging.getLogger("cmdare.cloud.notices")

DRAIN_PROVIDER = "ray"
NO_DEADLINE_S = 30.0  # a drain without a deadline (0): assume GCE's notice window


def drain_deadline(deadline_ms: int, now: float) -> float:
    """A drain's deadline in epoch seconds (a drain without one, 0: GCE's notice window from ``now``)."""
    return deadline_ms / 1000.0 if deadline_ms else now + NO_DEADLINE_S


def draining_nodes() -> dict[str, int]:
    """``{node id (hex): deadline (epoch ms, 0 for none)}`` of the nodes the GCS lists as draining."""
    import ray

    return dict(ray._private.state.state.get_draining_nodes())


class DrainWatcher:
    """Polls the GCS for a drain of ``node_id`` in a daemon thread; :attr:`notice` once one is seen.

    Args:
        node_id: the node to watch (hex), e.g. ``ray.get_runtime_context().get_node_id()``.
        poll_interval_s: seconds between polls (each is one GCS request).
        source: the draining-node lookup (default :func:`draining_nodes`; injectable for tests).
        clock: epoch seconds.

    Raises:
        UserInputError: an empty node id or a non-positive interval.
    """

    def __init__(self, node_id: str, poll_interval_s: float = 0.5,
                 source: Callable[[], dict[str, int]] = draining_nodes, clock: Callable[[], float] = time.time):
        if not node_id:
            raise UserInputError("DrainWatcher needs the node id to watch")
        if not poll_interval_s > 0:
            raise UserInputError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        self.node_id, self.poll_interval_s = node_id, float(poll_interval_s)
        self._source, self._clock = source, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notice: Notice | None = None
        self.errors = 0

    @property
    def notice(self) -> Notice | None:
        """The drain as a notice once seen, else ``None``."""
        return self._notice

    def poll_once(self) -> Notice | None:
        """One look at the GCS's draining nodes: a notice if this node is among them."""
        deadline_ms = self._source().get(self.node_id)
        if deadline_ms is None:
            return None
        now = self._clock()
        return Notice(DRAIN_PROVIDER, now, drain_deadline(deadline_ms, now), action="drain",
                      raw=f"deadline_ms={deadline_ms}")

    def start(self) -> DrainWatcher:
        """Start polling (idempotent); returns ``self``."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="cmdare-drain-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
            except Exception as err:  # noqa: BLE001 - the GCS unreachable for a moment: retry
                self.errors += 1
                log.debug("draining-node lookup failed: %s", err)
                notice = None
            if notice is not None:
                self._notice = notice
                return
            self._stop.wait(self.poll_interval_s)
