"""Preemption notices: poll a cloud metadata endpoint, and a local server that emulates one.

GCE sets ``computeMetadata/v1/instance/preempted`` to ``TRUE`` about 30 s before it stops a
preemptible VM (header ``Metadata-Flavor: Google`` required). EC2 answers
``latest/meta-data/spot/instance-action`` with ``{"action": "terminate", "time": "..."}`` two minutes
before a Spot interruption and 404 otherwise; with IMDSv2 every request carries a session token from
``PUT latest/api/token``. :class:`NoticeWatcher` polls either in a daemon thread with the standard
library only, and calls ``on_notice`` once. An unreachable endpoint never crashes it: it counts the
error and retries with exponential backoff.

:class:`LocalMetadataServer` is a real HTTP server on ``127.0.0.1`` serving both endpoints; tests and
local runs flip it to "preempted" with :meth:`LocalMetadataServer.preempt` to emulate a notice for a
Ray worker.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cmdare.errors import UnknownNameError, UserInputError

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
    "watcher_from_env",
]

log = logging.getLogger(__name__)

PROVIDERS: tuple[str, ...] = ("gce", "aws")
DEFAULT_URLS: dict[str, str] = {
    "gce": "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
    "aws": "http://169.254.169.254/latest/meta-data/spot/instance-action",
}
GCE_PATH = "/computeMetadata/v1/instance/preempted"
AWS_PATH = "/latest/meta-data/spot/instance-action"
AWS_TOKEN_PATH = "/latest/api/token"
# GCE: "Compute Engine sends a preemption notice ... 30 seconds" (preemptible VM docs).
GCE_NOTICE_S = 30.0
# EC2: "a Spot Instance interruption notice ... two minutes before" (Spot interruption docs).
AWS_NOTICE_S = 120.0
AWS_TOKEN_TTL_S = 21600
MAX_BACKOFF_S = 30.0
# Set on cloud worker nodes by the generated cluster config (cmdare.cloud.launcher); the URL override
# lets local runs point a worker at a LocalMetadataServer.
NOTICE_PROVIDER_ENV = "CMDARE_NOTICE_PROVIDER"
NOTICE_URL_ENV = "CMDARE_NOTICE_URL"
# Metadata servers are link-local: never send these requests through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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


def _check_provider(provider: str) -> str:
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


class NoticeWatcher:
    """Polls one preemption-notice endpoint in a daemon thread and reports the first notice.

    Args:
        url: the endpoint (default: the provider's metadata URL, reachable only on that cloud).
        provider: ``'gce'`` or ``'aws'``.
        poll_interval_s: seconds between polls while no notice and no error.
        on_notice: called once, from the watcher thread, with the :class:`Notice`; its exceptions are
            logged and counted, never raised.
        timeout_s: HTTP timeout per request.
        max_backoff_s: cap of the retry delay after consecutive errors (doubling from the interval).
        wait_for_change: GCE only: use ``?wait_for_change=true`` long polls (the server answers as soon
            as the value changes) instead of plain polls.
        clock: time source (epoch seconds), injectable for tests.

    Raises:
        UnknownNameError: unknown provider.
        UserInputError: non-positive interval or timeout, or a URL that is not http(s).
    """

    def __init__(
        self,
        url: str | None = None,
        provider: str = "gce",
        poll_interval_s: float = 1.0,
        on_notice: Callable[[Notice], None] | None = None,
        timeout_s: float = 2.0,
        max_backoff_s: float = MAX_BACKOFF_S,
        wait_for_change: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider = _check_provider(provider)
        self.url = url or DEFAULT_URLS[self.provider]
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserInputError(f"notice URL must be http(s)://host[:port]/path, got {self.url!r}")
        for name, value in (("poll_interval_s", poll_interval_s), ("timeout_s", timeout_s),
                            ("max_backoff_s", max_backoff_s)):
            if not value > 0:
                raise UserInputError(f"{name} must be > 0, got {value!r}")
        self.poll_interval_s = float(poll_interval_s)
        self.timeout_s = float(timeout_s)
        self.max_backoff_s = max(float(max_backoff_s), self.poll_interval_s)
        self.on_notice = on_notice
        self.wait_for_change = bool(wait_for_change) and self.provider == "gce"
        self._clock = clock
        self._token_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, AWS_TOKEN_PATH, "", ""))
        self._token: str | None = None
        self._token_expires = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._notice: Notice | None = None
        self.polls = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.callback_errors = 0
        self.last_error: str | None = None

    # ---------------------------------------------------------------- state
    @property
    def notice(self) -> Notice | None:
        """The notice once seen, else ``None``."""
        with self._lock:
            return self._notice

    @property
    def running(self) -> bool:
        """Whether the polling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> NoticeWatcher:
        """Start polling in a daemon thread (idempotent); returns ``self``."""
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"cmdare-notice-{self.provider}", daemon=True)
        self._thread.start()
        return self

    def stop(self, join_timeout_s: float | None = None) -> None:
        """Stop polling and wait for the thread (at most about one request timeout)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timeout_s + 1.0 if join_timeout_s is None else join_timeout_s)

    def __enter__(self) -> NoticeWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- polling
    def poll_once(self) -> Notice | None:
        """One request to the endpoint: the notice if there is one, else ``None``.

        Raises:
            OSError: (including ``urllib.error.URLError``) the endpoint cannot be reached or answered
                with an unexpected status; the polling loop counts these and backs off.
        """
        self.polls += 1
        if self.provider == "gce":
            return self._poll_gce()
        return self._poll_aws()

    def _open(self, request: urllib.request.Request, timeout_s: float) -> tuple[int, str]:
        try:
            with _OPENER.open(request, timeout=timeout_s) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            body = err.read().decode("utf-8", "replace") if err.fp is not None else ""
            return err.code, body

    def _poll_gce(self) -> Notice | None:
        url, timeout = self.url, self.timeout_s
        if self.wait_for_change:
            wait_s = max(1, round(self.poll_interval_s))
            sep = "&" if urllib.parse.urlsplit(url).query else "?"
            url = f"{url}{sep}wait_for_change=true&timeout_sec={wait_s}"
            timeout = self.timeout_s + wait_s
        status, body = self._open(urllib.request.Request(url, headers={"Metadata-Flavor": "Google"}), timeout)
        if status != 200:
            raise OSError(f"GCE metadata answered HTTP {status}")
        if body.strip().upper() == "TRUE":
            now = self._clock()
            return Notice("gce", detected_at=now, deadline=now + GCE_NOTICE_S, action="preempt", raw=body.strip())
        return None

    def _aws_token(self) -> str:
        now = self._clock()
        if self._token is None or now >= self._token_expires:
            req = urllib.request.Request(self._token_url, method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)})
            status, body = self._open(req, self.timeout_s)
            if status != 200 or not body.strip():
                raise OSError(f"IMDSv2 token request answered HTTP {status}")
            self._token, self._token_expires = body.strip(), now + AWS_TOKEN_TTL_S - 60
        return self._token

    def _poll_aws(self) -> Notice | None:
        for attempt in (1, 2):
            req = urllib.request.Request(self.url, headers={"X-aws-ec2-metadata-token": self._aws_token()})
            status, body = self._open(req, self.timeout_s)
            if status == 401 and attempt == 1:  # token expired or revoked: fetch a new one once
                self._token = None
                continue
            break
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"EC2 instance metadata answered HTTP {status}")
        now = self._clock()
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            data = {}
        action = str(data.get("action", "terminate")) if isinstance(data, dict) else "terminate"
        deadline = _parse_aws_time(data.get("time") if isinstance(data, dict) else None, now + AWS_NOTICE_S)
        return Notice("aws", detected_at=now, deadline=deadline, action=action, raw=body.strip())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
            except Exception as err:  # noqa: BLE001 - any failure of the endpoint: count, back off, retry
                self.errors += 1
                self.consecutive_errors += 1
                self.last_error = f"{type(err).__name__}: {err}"
                delay = min(self.poll_interval_s * 2 ** min(self.consecutive_errors, 30), self.max_backoff_s)
                log.debug("notice endpoint %s failed (%s); retry in %.2fs", self.url, self.last_error, delay)
                self._stop.wait(delay)
                continue
            self.consecutive_errors = 0
            if notice is not None:
                with self._lock:
                    self._notice = notice
                self._deliver(notice)
                return
            if not self.wait_for_change:
                self._stop.wait(self.poll_interval_s)

    def _deliver(self, notice: Notice) -> None:
        if self.on_notice is None:
            return
        try:
            self.on_notice(notice)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the watcher thread silently
            self.callback_errors += 1
            log.exception("on_notice callback failed for %s notice", notice.provider)


def watcher_from_env(
    on_notice: Callable[[Notice], None] | None = None, poll_interval_s: float = 1.0,
    environ: dict[str, str] | None = None,
) -> NoticeWatcher | None:
    """A (not yet started) watcher configured by ``$CMDARE_NOTICE_PROVIDER`` / ``$CMDARE_NOTICE_URL``.

    Returns ``None`` when no provider is set (e.g. an on-demand or local server without emulation).

    Raises:
        UnknownNameError: the provider variable names an unknown provider.
    """
    env = os.environ if environ is None else environ
    provider = (env.get(NOTICE_PROVIDER_ENV) or "").strip()
    if not provider:
        return None
    return NoticeWatcher(env.get(NOTICE_URL_ENV) or None, provider, poll_interval_s=poll_interval_s,
                         on_notice=on_notice)


class _Handler(BaseHTTPRequestHandler):
    server: _MetadataHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base-class signature
        log.debug("metadata server: " + format, *args)

    def _reply(self, status: int, body: str = "", content_type: str = "text/plain", extra: dict | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        owner = self.server.owner
        parts = urllib.parse.urlsplit(self.path)
        owner._count(parts.path)
        if parts.path == GCE_PATH:
            if self.headers.get("Metadata-Flavor") != "Google":
                self._reply(403, "Missing Metadata-Flavor:Google header.")
                return
            query = urllib.parse.parse_qs(parts.query)
            if query.get("wait_for_change", ["false"])[0].lower() == "true":
                owner._wait_preempted(float(query.get("timeout_sec", ["30"])[0]))
            value = "TRUE" if owner.preempted else "FALSE"
            self._reply(200, value, extra={"Metadata-Flavor": "Google"})
        elif parts.path == AWS_PATH:
            token = self.headers.get("X-aws-ec2-metadata-token")
            if not owner._valid_token(token):
                self._reply(401, "")
            elif owner.preempted:
                self._reply(200, json.dumps(owner._aws_body()), content_type="application/json")
            else:
                self._reply(404, "Not Found")
        else:
            self._reply(404, "Not Found")

    def do_PUT(self) -> None:  # noqa: N802 - http.server naming
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = urllib.parse.urlsplit(self.path).path
        owner._count(path)
        if path != AWS_TOKEN_PATH:
            self._reply(404, "Not Found")
            return
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= AWS_TOKEN_TTL_S:
            self._reply(400, "")
            return
        self._reply(200, owner._new_token())


class _MetadataHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: LocalMetadataServer


class LocalMetadataServer:
    """A real HTTP server on 127.0.0.1 that serves the GCE and AWS preemption endpoints.

    It starts healthy ("not preempted"). :meth:`preempt` flips it (optionally after a delay); from
    then on GCE answers ``TRUE`` and AWS returns an instance-action document whose ``time`` is
    ``notice_s`` seconds after the flip. AWS requests need an IMDSv2 token, as on EC2.

    Args:
        port: port to bind (``0``: a free port chosen by the OS).
        aws_action: the AWS ``action`` field (``'terminate'``, ``'stop'`` or ``'hibernate'``).
        notice_s: seconds between the flip and the AWS ``time`` field.
    """

    def __init__(self, port: int = 0, aws_action: str = "terminate", notice_s: float = AWS_NOTICE_S) -> None:
        self._requested_port = port
        self.aws_action = aws_action
        self.notice_s = notice_s
        self._httpd: _MetadataHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._preempted_at: float | None = None
        self._timers: list[threading.Timer] = []
        self._tokens: set[str] = set()
        self._token_seq = 0
        self._closing = False
        self.requests: dict[str, int] = {}

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> LocalMetadataServer:
        """Bind and serve in a daemon thread (idempotent); returns ``self``."""
        if self._httpd is not None:
            return self
        self._closing = False
        httpd = _MetadataHTTPServer(("127.0.0.1", self._requested_port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="cmdare-metadata-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        for timer in self._timers:
            timer.cancel()
        with self._cond:
            self._closing = True  # release long polls (wait_for_change) still held by handler threads
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None

    def __enter__(self) -> LocalMetadataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- addresses
    @property
    def port(self) -> int:
        """The bound port."""
        if self._httpd is None:
            raise UserInputError("LocalMetadataServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def gce_url(self) -> str:
        """URL of the emulated GCE ``instance/preempted`` value."""
        return self.base_url + GCE_PATH

    @property
    def aws_url(self) -> str:
        """URL of the emulated EC2 ``spot/instance-action`` document."""
        return self.base_url + AWS_PATH

    def url_for(self, provider: str) -> str:
        """The emulated endpoint for ``provider`` (``'gce'`` or ``'aws'``)."""
        return self.gce_url if _check_provider(provider) == "gce" else self.aws_url

    # ---------------------------------------------------------------- control
    @property
    def preempted(self) -> bool:
        """Whether the server currently reports a preemption."""
        with self._cond:
            return self._preempted_at is not None

    @property
    def preempted_at(self) -> float | None:
        """Epoch seconds of the flip, or ``None``."""
        with self._cond:
            return self._preempted_at

    def preempt(self, delay_s: float = 0.0) -> None:
        """Report a preemption from now on (or after ``delay_s`` seconds; returns at once)."""
        if delay_s < 0:
            raise UserInputError(f"delay_s must be >= 0, got {delay_s!r}")
        if delay_s == 0:
            self._flip()
            return
        timer = threading.Timer(delay_s, self._flip)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def reset(self) -> None:
        """Back to "not preempted" (cancels pending delayed flips)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        with self._cond:
            self._preempted_at = None

    def _flip(self) -> None:
        with self._cond:
            if self._preempted_at is None:
                self._preempted_at = time.time()
            self._cond.notify_all()

    # ---------------------------------------------------------------- handler helpers
    def _count(self, path: str) -> None:
        with self._cond:
            self.requests[path] = self.requests.get(path, 0) + 1

    def _wait_preempted(self, timeout_s: float) -> None:
        deadline = time.monotonic() + max(0.0, min(timeout_s, 300.0))
        with self._cond:
            while self._preempted_at is None and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _new_token(self) -> str:
        with self._cond:
            self._token_seq += 1
            token = f"cmdare-local-token-{self._token_seq}"
            self._tokens.add(token)
            return token

    def _valid_token(self, token: str | None) -> bool:
        with self._cond:
            return token is not None and token in self._tokens

    def _aws_body(self) -> dict[str, str]:
        flipped = self.preempted_at or time.time()
        when = datetime.fromtimestamp(flipped + self.notice_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"action": self.aws_action, "time": when}
