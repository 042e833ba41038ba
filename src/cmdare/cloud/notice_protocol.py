"""The GCE and EC2 preemption-notice protocols: endpoints, timings, the :class:`Notice` record, parsing.

GCE sets ``computeMetadata/v1/instance/preempted`` to ``TRUE`` about 30 s before it stops a
preemptible VM (header ``Metadata-Flavor: Google`` required). EC2 answers
``latest/meta-data/spot/instance-action`` with ``{"action": "terminate", "time": "..."}`` two minutes
before a Spot interruption and 404 otherwise; ``latest/meta-data/events/recommendations/rebalance`` answers
``{"noticeTime": "..."}`` once EC2 sees the instance at elevated risk of interruption (a rebalance recommendation,
which can come well before the interruption notice) and 404 before; with IMDSv2 every request carries a session
token from ``PUT latest/api/token``. Both the watcher (:mod:`cmdare.cloud.notice_watcher`) and the local emulator
(:mod:`cmdare.cloud.metadata_server`) speak these protocols through the names here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cmdare.errors import UnknownNameError

__all__ = [
    "AWS_NOTICE_S",
    "AWS_PATH",
    "AWS_REBALANCE_PATH",
    "AWS_TOKEN_PATH",
    "AWS_TOKEN_TTL_S",
    "DEFAULT_URLS",
    "GCE_NOTICE_S",
    "GCE_PATH",
    "Notice",
    "PROVIDERS",
    "aws_notice",
    "aws_rebalance",
    "check_provider",
    "gce_notice",
]

PROVIDERS: tuple[str, ...] = ("gce", "aws")
DEFAULT_URLS: dict[str, str] = {
    "gce": "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
    "aws": "http://169.254.169.254/latest/meta-data/spot/instance-action",
}
GCE_PATH = "/computeMetadata/v1/instance/preempted"
AWS_PATH = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
AWS_TOKEN_PATH = "/latest/api/token"
# GCE: "Compute Engine sends a preemption notice ... 30 seconds" (preemptible VM docs).
GCE_NOTICE_S = 30.0
# EC2: "a Spot Instance interruption notice ... two minutes before" (Spot interruption docs).
AWS_NOTICE_S = 120.0
AWS_TOKEN_TTL_S = 21600


@dataclass(frozen=True)
class Notice:
    """A preemption notice: who sent it, when cmdare saw it and when the server will be gone.

    Attributes:
        provider: ``'gce'`` or ``'aws'``.
        detected_at: epoch seconds when the watcher saw the notice.
        deadline: epoch seconds when the server is expected to stop (GCE: detection + 30 s; AWS: the
            notice's ``time`` field).
        action: ``'preempt'`` (GCE) or the AWS action (``'terminate'``, ``'stop'``, ``'hibernate'``).
        raw: the endpoint's response body.
    """

    provider: str
    detected_at: float
    deadline: float
    action: str = "preempt"
    raw: str = ""

    def time_left_s(self, now: float | None = None) -> float:
        """Seconds until :attr:`deadline` (negative once it has passed)."""
        return self.deadline - (time.time() if now is None else now)


def check_provider(provider: str) -> str:
    """``provider`` normalised (``'gce'`` or ``'aws'``).

    Raises:
        UnknownNameError: unknown provider.
    """
    key = str(provider).strip().lower()
    if key not in PROVIDERS:
        raise UnknownNameError("notice provider", provider, PROVIDERS)
    return key


def _parse_aws_time(text: Any, fallback: float) -> float:
    if not isinstance(text, str):
        return fallback
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return fallback
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def gce_notice(body: str, clock: Callable[[], float]) -> Notice | None:
    """The notice in a GCE ``instance/preempted`` answer (HTTP 200), or ``None`` while it is not ``TRUE``.

    ``clock`` (epoch seconds) is read only when there is a notice.
    """
    if body.strip().upper() != "TRUE":
        return None
    now = clock()
    return Notice("gce", detected_at=now, deadline=now + GCE_NOTICE_S, action="preempt", raw=body.strip())


def aws_notice(body: str, clock: Callable[[], float]) -> Notice:
    """The notice in an EC2 ``spot/instance-action`` answer (HTTP 200).

    A body that is not the expected JSON document still counts as a ``terminate`` notice, due
    :data:`AWS_NOTICE_S` seconds after detection.
    """
    now = clock()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        data = {}
    action = str(data.get("action", "terminate")) if isinstance(data, dict) else "terminate"
    deadline = _parse_aws_time(data.get("time") if isinstance(data, dict) else None, now + AWS_NOTICE_S)
    return Notice("aws", detected_at=now, deadline=deadline, action=action, raw=body.strip())


def aws_rebalance(body: str, clock: Callable[[], float]) -> Notice:
    """The rebalance recommendation in an EC2 ``events/recommendations/rebalance`` answer (HTTP 200): a server at
    elevated risk, not yet interrupted (``action='rebalance'``); its ``deadline`` is the soonest the server can go,
    :data:`AWS_NOTICE_S` after detection (the interruption notice, which gives two minutes, has not come)."""
    now = clock()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        data = {}
    seen = _parse_aws_time(data.get("noticeTime") if isinstance(data, dict) else None, now)
    return Notice("aws", detected_at=now, deadline=max(now, seen) + AWS_NOTICE_S, action="rebalance",
                  raw=body.strip())
