"""Calls the coordinator does not wait for, fetched once they are done.

Settings pushed to shards and workers, a revoked worker's last chunk: a call on a revoked (killed)
actor fails, and a failed result nobody fetches is printed by Ray as an "Unhandled error" block.
"""

from __future__ import annotations

import logging
from typing import Any

from cmdare.train.runtime.faults import user_mistake

__all__ = ["DetachedCalls"]

log = logging.getLogger(__name__)


class DetachedCalls:
    """Object references kept until fetched; expected failures (the actor is gone) are discarded."""

    def __init__(self) -> None:
        self.refs: list[Any] = []

    def add(self, *refs: Any) -> None:
        """Keep ``refs`` until they are fetched."""
        self.refs.extend(refs)

    def reap(self, timeout_s: float = 0.0) -> None:
        """Fetch the calls that are done (waiting up to ``timeout_s`` for all of them).

        A call on a worker or shard that was revoked, removed or killed fails with ``RayActorError``:
        expected, discarded. Any other failure is logged on one line.
        """
        import ray

        if not self.refs:
            return
        ready, self.refs = ray.wait(self.refs, num_returns=len(self.refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.TaskCancelledError):
                pass  # the actor is gone (revoked or killed): its pending calls fail, as expected
            except Exception as err:  # noqa: BLE001 - a best-effort call: report, keep training
                if user_mistake(err) is not None:
                    continue  # the user's code failed: the run ends with that line (said once, by the driver)
                last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
                log.warning("a call the coordinator did not wait for failed: %s: %s", type(err).__name__, last)
