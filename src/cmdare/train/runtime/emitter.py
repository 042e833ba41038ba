"""Reports to the run's callbacks: events, server events, steps, evaluations, checkpoints."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from cmdare.cloud.local import Server
from cmdare.control.run_commands import Command
from cmdare.events import EventReport, TrainCallback

__all__ = ["RunEmitter"]


class RunEmitter:
    """Calls every callback's hook; stamps events with the run id, the time and the global step."""

    def __init__(self, run_id: str, callbacks: Sequence[TrainCallback], global_step: Callable[[], int]):
        self.run_id, self.callbacks, self._step = run_id, list(callbacks), global_step

    def emit(self, hook: str, report: Any) -> None:
        """``callback.<hook>(report)`` for every callback."""
        for cb in self.callbacks:
            getattr(cb, hook)(report)

    def event(self, kind: str, **fields: Any) -> None:
        """An :class:`EventReport` of ``kind`` (worker_id, server_id, shard_id, details as fields)."""
        self.emit("on_event", EventReport(self.run_id, time.time(), kind, self._step(), **fields))

    def server_event(self, kind: str, server: Server, worker_id: int | None = None,
                     extra: dict[str, Any] | None = None) -> None:
        """An event about ``server``, carrying its record (type, price, phases) and ``extra``."""
        details = server.record()
        if server.joined_at is not None:
            details["joined_at"] = server.joined_at
        details.update(extra or {})
        self.event(kind, worker_id=worker_id, server_id=server.server_id, details=details)

    def end_server(self, server: Server, reason: str) -> None:
        """Mark ``server`` ended (if still alive) and report it."""
        if server.alive:
            server.end(reason)
        self.server_event("server_ended", server, extra={"reason": reason, "uptime_s": server.uptime_s()})

    def decision(self, cmd: Command) -> None:
        """The run controller's command ``cmd``, its plain fields and its reason, as a ``decision`` event (``report
        run`` shows them as the run's decision history)."""
        fields = {f.name: getattr(cmd, f.name) for f in dataclasses.fields(cmd)}
        details = {k: v for k, v in fields.items() if isinstance(v, str | int | float | bool) and k != "why"}
        self.event("decision", worker_id=getattr(cmd, "worker_id", None),
                   details={"command": type(cmd).__name__, "why": cmd.why, **details})
