"""The end of a run: calls left running fetched, actors killed, servers and Ray let go."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from cmdare.cloud.local import ServerProvider
from cmdare.train.runtime.detached import DetachedCalls

__all__ = ["DETACHED_DRAIN_S", "release_run"]

DETACHED_DRAIN_S = 5.0  # how long to wait for calls on killed actors to fail


def release_run(groups: Iterable[Any], detached: DetachedCalls, left_running: Iterable[Any],
                provider: ServerProvider, stop_ray: bool) -> None:
    """After the run's end was reported (the worker and shard ``groups``, ``None`` for one never set up,
    released their servers before it, so the store recorded their ends): fetch the calls ``left_running``
    by a loop that ended on an error, kill the actors, release every server at the provider, and shut Ray
    down when this run started it."""
    import ray

    groups = [g for g in groups if g is not None]
    detached.add(*left_running)
    with contextlib.suppress(Exception):  # Ray itself is failing: nothing left to fetch
        detached.reap()
    for group in groups:
        group.kill_all()
    with contextlib.suppress(Exception):
        # calls still pending on the actors just killed fail within moments: fetch (discard) them so
        # that Ray does not print them as unhandled errors when their references are dropped
        detached.reap(DETACHED_DRAIN_S)
    detached.refs = []
    for server in provider.servers:
        provider.release(server)
    provider.close()
    if stop_ray:
        ray.shutdown()
