""":class:`NoticeWatcher`: poll a cloud metadata endpoint for a preemption notice in a daemon thread.

It uses the standard library only and calls ``on_notice`` once. An unreachable endpoint never crashes
it: it counts the error and retries with exponential backoff. :func:`watcher_from_env` builds one from
the variables the generated cluster config (:mod:`cmdare.cloud.launcher`) sets on worker nodes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from cmdare.cloud.notice_protocol import (
    AWS_REBALANCE_PATH,
    AWS_TOKEN_PATH,
    AWS_TOKEN_TTL_S,
    DEFAULT_URLS,
    Notice,
    aws_notice,
    aws_rebalance,
    check_provider,
    gce_notice,
)
from cmdare.errors import UserInputError

__all__ = ["MAX_BACKOFF_S", "NOTICE_PROVIDER_ENV", "NOTICE_URL_ENV", "NoticeWatcher", "watcher_from_env"]

log = logging.getLogger("cmdare.cloud.notices")  # the name from before the split, kept for log configs

MAX_BACKOFF_S = 30.0
# Set on cloud worker nodes by the generated cluster config (cmdare.cloud.launcher); the URL override
# lets local runs point a worker at a LocalMetadataServer.
NOTICE_PROVIDER_ENV = "CMDARE_NOTICE_PROVIDER"
NOTICE_URL_ENV = "CMDARE_NOTICE_URL"
# Metadata servers are link-local: never send these requests through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
        self.provider = check_provider(provider)
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
        self._rebalance_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, AWS_REBALANCE_PATH, "", ""))
        self._risk: Notice | None = None
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
    def risk(self) -> Notice | None:
        """AWS: the rebalance recommendation once seen (the server is at elevated risk; no notice yet), else None."""
        with self._lock:
            return self._risk

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
        return gce_notice(body, self._clock)

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
            if self.risk is None:
                self._poll_rebalance()
            return None
        if status != 200:
            raise OSError(f"EC2 instance metadata answered HTTP {status}")
        return aws_notice(body, self._clock)

    def _poll_rebalance(self) -> None:
        """AWS, no notice yet: whether EC2 recommends a rebalance (kept in :attr:`risk`, polled until seen)."""
        req = urllib.request.Request(self._rebalance_url, headers={"X-aws-ec2-metadata-token": self._aws_token()})
        status, body = self._open(req, self.timeout_s)
        if status == 200:
            risk = aws_rebalance(body, self._clock)
            with self._lock:
                self._risk = risk
            log.warning("EC2 rebalance recommendation: this server is at elevated risk of interruption")
        elif status not in (401, 404):
            raise OSError(f"EC2 instance metadata answered HTTP {status}")

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
