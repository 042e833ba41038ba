"""The Ray driver's checks on its cluster: a watchdog on its own loop, and the probe of a silent run.

The watchdog: when Ray's GCS marks the node the driver runs on dead (its health checks went unanswered, e.g.
a machine so loaded that the raylet missed them), the raylet exits and every Ray call of the driver blocks for
good, even ``ray.wait`` with a time-out: the driver's loop can no longer tell the controller anything. A
thread watches the loop's heartbeat; once the loop has been silent for :data:`SILENT_S` it asks the GCS (with
a time-out, from this thread) whether the driver's node is still alive. If the node is dead, or the GCS does
not answer twice in a row, the run cannot go on: the watchdog hands the reason to ``on_lost`` (the trainer
ends the run: its status, its uploads, one line on stderr, exit status 1).

The probe (:func:`probe_actors`, :func:`cluster_lost`): the controller heard nothing for a while; which
actors still answer, and is the cluster itself still there?
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CHECK_EVERY_S", "SILENT_S", "LoopWatchdog", "cluster_lost", "node_state", "probe_actors"]

SILENT_S = 10.0  # a loop pass that takes longer than this is looked into (actions of its own take seconds)
CHECK_EVERY_S = 2.0
GCS_TIMEOUT_S = 5.0


def node_state(node_id: str, timeout_s: float = GCS_TIMEOUT_S) -> bool | None:
    """Whether the GCS says node ``node_id`` (hex) is alive; None when the GCS does not answer."""
    import ray

    try:
        infos = ray._private.worker.global_worker.gcs_client.get_all_node_info(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - the GCS is unreachable, or this Ray has no such call
        return None
    for nid, info in infos.items():
        if nid.hex() == node_id:
            return info.state == 0  # GcsNodeInfo.ALIVE
    return False


class LoopWatchdog:
    """Calls ``on_lost(reason)`` once when the loop stops beating and its Ray node is found gone."""

    def __init__(self, node_id: str | None, on_lost: Callable[[str], None], silent_s: float = SILENT_S,
                 check: Callable[[str], bool | None] = node_state, check_every_s: float = CHECK_EVERY_S):
        self.node_id, self.on_lost, self.silent_s, self.check = node_id, on_lost, silent_s, check
        self.check_every_s = check_every_s
        self.last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cmdare-watchdog", daemon=True)

    def start(self) -> LoopWatchdog:
        if self.node_id:
            self._thread.start()
        return self

    def beat(self) -> None:
        """The loop made a pass."""
        self.last_beat = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        unanswered = 0
        while not self._stop.wait(self.check_every_s):
            silent = time.monotonic() - self.last_beat
            if silent < self.silent_s:
                unanswered = 0
                continue
            alive = self.check(self.node_id)
            if alive:
                unanswered = 0
                continue
            unanswered = unanswered + 1 if alive is None else 2
            if unanswered >= 2:
                why = ("this run's Ray node was marked dead by Ray (its health checks went unanswered) and the "
                       "driver's Ray calls no longer return" if alive is False else
                       f"Ray's GCS does not answer and the driver has heard nothing for {silent:.0f} s")
                self._stop.set()
                self.on_lost(why)
                return


def cluster_lost() -> str | None:
    """Why the Ray cluster this driver uses is gone (its own node marked dead, the GCS unreachable), or None."""
    import ray

    try:
        node = ray.get_runtime_context().get_node_id()
        nodes = ray.nodes()
    except Exception as err:  # noqa: BLE001 - the GCS does not answer
        return f"the Ray cluster does not answer ({type(err).__name__})"
    mine = next((n for n in nodes if n.get("NodeID") == node), None)
    if mine is not None and not mine.get("Alive", True):
        return "this run's Ray node was marked dead by Ray (its health checks went unanswered)"
    return None


def probe_actors(actors: Mapping[Any, Any], timeout_s: float) -> tuple[dict[Any, str], list[Any]]:
    """Ping ``actors`` (key -> actor handle with a ``ping`` method) for at most ``timeout_s``: the keys that
    failed, with why (a Ray error's name, or ``"unresponsive"``), and the pings still in flight (the caller
    ends them)."""
    import ray

    pings = {actor.ping.remote(): key for key, actor in actors.items()}
    if not pings:
        return {}, []
    ready, pending = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
    failed = {pings[ref]: "unresponsive" for ref in pending}
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayError as err:
            failed[pings[ref]] = type(err).__name__
    return failed, list(pending)
