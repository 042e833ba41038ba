"""A worker as the run's executor holds it (:class:`WorkerHandle`: its actor, data slot and server), and why a
worker's start failed (:func:`start_error`: in one line, and whether a replacement would fail the same way)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmdare.cloud.local import Server

__all__ = ["WorkerHandle", "start_error"]


@dataclass
class WorkerHandle:
    """A worker the run started: its actor, data slot and server."""

    worker_id: int
    slot: int
    actor: Any
    server: Server
    revoked_at: float | None = None  # wall time it was revoked (injected) or told to leave (notice)
    replaces: dict[str, Any] | None = None  # the loss this worker replaces (for recovery figures)
    up: Any = None  # its ready() or adopt() call: when its process was up (start-up figures)
    spare: str | None = None  # a replacement on a warm spare: "up" (warm), "starting" or "server" (not up) when taken
    is_up: bool = False
    layout_version: int = 0  # the shard group's version it was built with
    node_id: str | None = None  # its Ray node (hex), once up
    avoids: tuple[str, ...] = ()  # the nodes its actor was asked to keep off (lost nodes, a real cluster)


def start_error(err: BaseException) -> tuple[str, bool]:
    """A worker's failed start in one line, and whether it is deterministic (its own constructor raised: a
    replacement would fail the same way; else its server or node went away)."""
    import ray

    text = str(err).strip()
    # its constructor raised: deterministic, unless what it raised is Ray's own (a shard it asked died meanwhile)
    deterministic = isinstance(err, ray.exceptions.RayActorError) and err.actor_init_failed and not any(
        name in text for name in ("RayActorError", "ActorDiedError", "ActorUnavailableError", "ObjectLostError",
                                  "GetTimeoutError", "RaySystemError"))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines) if "Error:" in ln or "Exception:" in ln), lines[-1] if lines else "")
    cause = cause.split("Error: ", 1)[-1] if deterministic and "Error: " in cause else cause
    if not deterministic:
        cause = _not_its_own(text) or cause
    return (cause or type(err).__name__), deterministic


def _not_its_own(text: str) -> str | None:
    """Why a worker's start failed, in words, when Ray says its node went (None: Ray says nothing of it)."""
    lowered = text.lower()
    if "drain" in lowered or "preempt" in lowered:
        return "its node was drained while it started"
    if "never ran" in lowered or "cancelled before it started" in lowered or "schedulingcancelled" in lowered:
        return "its creation was cancelled before it ran (its node died or was drained)"
    if "node" in lowered and ("died" in lowered or "dead" in lowered):
        return "its node died while it started"
    return None
