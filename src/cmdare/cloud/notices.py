"""Preemption notices: poll a cloud metadata endpoint, and a local server that emulates one.

This module gathers the notice API in one place; the code lives in three modules with one job each:

* :mod:`cmdare.cloud.notice_protocol` - the GCE/EC2 endpoints and timings, :class:`Notice`, and the
  parsing of each cloud's answer;
* :mod:`cmdare.cloud.notice_watcher` - :class:`NoticeWatcher`, which polls either endpoint in a daemon
  thread with the standard library only, calls ``on_notice`` once, and backs off on errors;
  :func:`watcher_from_env` configures one from the environment;
* :mod:`cmdare.cloud.metadata_server` - :class:`LocalMetadataServer`, a real HTTP server on
  ``127.0.0.1`` serving both endpoints; tests and local runs flip it to "preempted" with
  :meth:`LocalMetadataServer.preempt` to emulate a notice for a Ray worker.
"""

from __future__ import annotations

from typing import Any

# Every name importable from this module before the split still is (``noqa: F401``: not in ``__all__``).
from cmdare.cloud.metadata_server import LocalMetadataServer
from cmdare.cloud.notice_protocol import (
    AWS_NOTICE_S,
    AWS_PATH,  # noqa: F401
    AWS_TOKEN_PATH,  # noqa: F401
    AWS_TOKEN_TTL_S,  # noqa: F401
    DEFAULT_URLS,
    GCE_NOTICE_S,
    GCE_PATH,  # noqa: F401
    PROVIDERS,
    Notice,
)
from cmdare.cloud.notice_watcher import (
    MAX_BACKOFF_S,  # noqa: F401
    NOTICE_PROVIDER_ENV,
    NOTICE_URL_ENV,
    NoticeWatcher,
    watcher_from_env,
)

__all__ = [
    "AWS_NOTICE_S",
    "DEFAULT_URLS",
    "GCE_NOTICE_S",
    "LocalMetadataServer",
    "Notice",
    "NOTICE_PROVIDER_ENV",
    "NOTICE_URL_ENV",
    "NoticeWatcher",
    "PROVIDERS",
    "server_watchers",
    "watcher_from_env",
]


def server_watchers(notice: tuple[str, str] | None, node_id: str | None) -> list[Any]:
    """What tells a worker that its server goes away: the cloud's metadata endpoint (``notice``: the
    emulator's URL and provider; else ``CMDARE_NOTICE_PROVIDER`` on a cloud node), and, on Ray node
    ``node_id``, a drain of that node (:class:`~cmdare.cloud.drain_watcher.DrainWatcher`)."""
    watchers: list[Any] = []
    metadata = watcher_from_env(None, 1.0) if notice is None else NoticeWatcher(
        url=notice[0], provider=notice[1], poll_interval_s=0.2)
    if metadata is not None:
        watchers.append(metadata)
    if node_id:
        from cmdare.cloud.drain_watcher import DrainWatcher

        watchers.append(DrainWatcher(node_id))
    return watchers
