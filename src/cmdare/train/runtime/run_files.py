"""A run's control files in its storage: its configuration, the coordinator's status, ``cmdare ps`` requests.

``run.json`` holds the configuration the run started with (what ``--resume`` continues);
``status.json`` tells ``cmdare ps add|remove RUN`` whether the run is running, its global step and how
many shards it has; the coordinator rewrites it every :data:`HEARTBEAT_S` while the run trains, so a run
whose status says ``running`` but is older than :data:`STALE_AFTER_S` stopped without an end (killed, or
its machine lost) and reads as ``stale``; a request is one object under ``control/``, read (and removed)
by the coordinator at its next poll; ``parts.json`` lists the run's parts (its first training and each resume,
:mod:`cmdare.measure.run_parts`), so a resume on any machine knows what the parts before it trained and cost.
All live in the run's :class:`~cmdare.storage.Storage`, so they work from any machine that reaches it, also
when the run's storage is an object store.

``status.json`` also names the host and process of the driver that wrote it: on that host a ``running`` status
whose process is gone reads ``stale`` at once (a driver killed with ``kill -9``), not only after
:data:`STALE_AFTER_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cmdare.errors import DataNotFoundError, StorageError, UserInputError
from cmdare.storage import MissingObjectError, Storage, as_storage

__all__ = ["HEARTBEAT_S", "STALE_AFTER_S", "heartbeat", "read_parts", "read_requests", "read_run_spec",
           "read_status", "request_change", "write_parts", "write_run_spec", "write_status"]

#: Seconds between the coordinator's rewrites of ``status.json`` while the run trains.
HEARTBEAT_S = 10.0
#: A ``running`` status older than this is ``stale``: its coordinator is gone.
STALE_AFTER_S = 120.0

_STATUS = "status.json"
_CONTROL = "control"
_RUN = "run.json"
_PARTS = "parts.json"


def _run_name(run: Storage) -> str:
    return run.uri.rstrip("/").rsplit("/", 1)[-1]


def write_run_spec(run: Storage | str | os.PathLike[str], run_id: str, spec: dict[str, Any]) -> None:
    """The run's configuration, so that ``--resume RUN`` on another machine trains the same job."""
    run = as_storage(run)
    run.put(_RUN, json.dumps({"run_id": run_id, "spec": spec, "time": time.time()}).encode())


def read_run_spec(run: Storage | str | os.PathLike[str]) -> dict[str, Any] | None:
    """The configuration the run last started with, or None (a run older than this file, or none)."""
    run = as_storage(run)
    try:
        data = json.loads(run.get(_RUN))
    except (MissingObjectError, ValueError):
        return None
    return data.get("spec") if isinstance(data, dict) else None


def write_status(run: Storage | str | os.PathLike[str], status: str, num_shards: int, global_step: int) -> None:
    """The coordinator's view of the run, for the ``cmdare ps`` commands (with the driver's host and process)."""
    run = as_storage(run)
    run.put(_STATUS, json.dumps({"status": status, "num_shards": num_shards, "global_step": global_step,
                                 "time": time.time(), "host": _process_space(), "pid": os.getpid()}).encode())


def _process_space() -> str | None:
    """This host's boot and process-id namespace (with its name): where a process id means one process; None
    where the system does not say (then no process is looked up)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{socket.gethostname()}/{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _driver_gone(status: dict[str, Any]) -> bool:
    """Whether the driver that wrote ``status`` ran in this host's process space and its process is gone."""
    pid, here = status.get("pid"), _process_space()
    if here is None or status.get("host") != here or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process of that id: alive
        return False
    return False


def heartbeat(run: Storage, num_shards: int, global_step: int) -> str | None:
    """``status.json`` rewritten while the run trains; returns why the write failed (None: written). A write that
    fails is tried again at the next beat."""
    try:
        write_status(run, "running", num_shards, global_step)
    except (OSError, StorageError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def read_status(run: Storage | str | os.PathLike[str], now: float | None = None) -> dict[str, Any]:
    """The run's last status (``running`` older than :data:`STALE_AFTER_S` at ``now``, default the clock, reads
    ``stale``). Raises DataNotFoundError when it has none (never started here)."""
    run = as_storage(run)
    name = _run_name(run)
    try:
        status = json.loads(run.get(_STATUS))
        if not isinstance(status, dict) or not isinstance(status.get("time", 0.0), int | float):
            raise ValueError(status)
        now = time.time() if now is None else now
        if status.get("status") == "running" and (now - float(status.get("time", 0.0)) > STALE_AFTER_S
                                                  or _driver_gone(status)):
            status["status"] = "stale"
        return status
    except MissingObjectError:
        raise DataNotFoundError(f"no running training run {name} in {run.uri} (no status file)") from None
    except ValueError:
        raise DataNotFoundError(f"run {name}: status file {run.url(_STATUS)} is unreadable") from None


def read_parts(run: Storage | str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run's parts as recorded in ``parts.json`` (an empty list when it has none, or it is unreadable)."""
    run = as_storage(run)
    try:
        data = json.loads(run.get(_PARTS))
    except (MissingObjectError, StorageError, ValueError):
        return []
    parts = data.get("parts") if isinstance(data, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def write_parts(run: Storage | str | os.PathLike[str], parts: Sequence[dict[str, Any]]) -> None:
    """Write the run's parts (a failed write is left: the parts are shown, only a later resume misses them)."""
    with contextlib.suppress(OSError, StorageError):
        as_storage(run).put(_PARTS, json.dumps({"parts": list(parts)}).encode())


def request_change(run: Storage | str | os.PathLike[str], action: str, shard: int | None = None) -> str:
    """Queue ``add`` or ``remove`` for a running run; refuses finished runs and the last shard.
    Returns the request's location."""
    run = as_storage(run)
    status = read_status(run)
    name = _run_name(run)
    if status["status"] == "stale":
        raise UserInputError(f"run {name} is stale (its coordinator last reported {time.time() - status['time']:.0f} s "
                             "ago: killed, or its machine lost): cannot change its shards; resume it with --resume")
    if status["status"] != "running":
        raise UserInputError(f"run {name} is {status['status']}: cannot change its shards")
    if action == "remove":
        if status["num_shards"] <= 1:
            raise UserInputError(f"run {name} has one parameter shard: cannot remove the last shard")
        if shard is not None and not 0 <= shard < status["num_shards"]:
            raise UserInputError(f"shard {shard} out of range: run {name} has {status['num_shards']}")
    control = run.child(_CONTROL)
    request = f"{time.time_ns()}-{action}.json"
    control.put(request, json.dumps({"action": action, "shard": shard}).encode())
    return control.url(request)


def read_requests(run: Storage | str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Pop the queued control requests, oldest first."""
    run = as_storage(run)
    control = run.child(_CONTROL)
    out = []
    for name in control.names(suffix=".json"):
        try:
            out.append(json.loads(control.get(name)))
        except (MissingObjectError, ValueError):
            pass  # removed meanwhile, or not a request: dropped
        finally:
            control.delete(name)
    return out


def new_run_id() -> str:
    """A readable unique run id, e.g. ``run-20261129-201500-ab12``."""
    import secrets
    import time

    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)
