""":class:`LocalMetadataServer`: a local HTTP server that emulates the GCE and EC2 preemption endpoints.

It is a real HTTP server on ``127.0.0.1`` serving both endpoints (and the IMDSv2 token endpoint);
tests and local runs flip it to "preempted" with :meth:`LocalMetadataServer.preempt` to emulate a
notice for a Ray worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.parse
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cmdare.cloud.notice_protocol import (
    AWS_NOTICE_S,
    AWS_PATH,
    AWS_REBALANCE_PATH,
    AWS_TOKEN_PATH,
    AWS_TOKEN_TTL_S,
    GCE_PATH,
    check_provider,
)
from cmdare.errors import UserInputError

__all__ = ["LocalMetadataServer"]

log = logging.getLogger("cmdare.cloud.notices")  # the name from before the split, kept for log configs

#: Connections served at once (each long-poll holds one); more are answered 503 at once.
MAX_CONNECTIONS = 64
#: The longest long-poll (``timeout_sec``) and request body the server accepts.
MAX_WAIT_S = 3600.0
MAX_BODY_BYTES = 65536


class _Handler(BaseHTTPRequestHandler):
    server: _MetadataHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection is closed: it holds a thread

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
                try:
                    wait_s = float(query.get("timeout_sec", ["30"])[0])
                except ValueError:
                    wait_s = -1.0
                if not 0 <= wait_s <= MAX_WAIT_S:  # nan fails too
                    self._reply(400, f"timeout_sec must be a number of seconds from 0 to {MAX_WAIT_S:g}")
                    return
                owner._wait_preempted(wait_s)
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
        elif parts.path == AWS_REBALANCE_PATH:
            token = self.headers.get("X-aws-ec2-metadata-token")
            if not owner._valid_token(token):
                self._reply(401, "")
            elif owner.rebalance_at is not None:
                when = datetime.fromtimestamp(owner.rebalance_at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                self._reply(200, json.dumps({"noticeTime": when}), content_type="application/json")
            else:
                self._reply(404, "Not Found")
        else:
            self._reply(404, "Not Found")

    def do_PUT(self) -> None:  # noqa: N802 - http.server naming
        owner = self.server.owner
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True  # the body cannot be skipped: the connection ends with the answer
            self._reply(400, f"Content-Length must be a whole number of bytes from 0 to {MAX_BODY_BYTES}")
            return
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
    """One thread per connection, at most :data:`MAX_CONNECTIONS` at once."""

    daemon_threads = True
    allow_reuse_address = True
    owner: LocalMetadataServer

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


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
        self.rebalance_at: float | None = None  # AWS: when a rebalance recommendation was issued
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
        return self.gce_url if check_provider(provider) == "gce" else self.aws_url

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

    def recommend_rebalance(self) -> None:
        """AWS: issue a rebalance recommendation from now on (the server at elevated risk; no notice yet)."""
        with self._cond:
            if self.rebalance_at is None:
                self.rebalance_at = time.time()

    def reset(self) -> None:
        """Back to "not preempted", no rebalance recommendation (cancels pending delayed flips)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        with self._cond:
            self._preempted_at = None
            self.rebalance_at = None

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
