"""Preemption-notice watcher against a real local HTTP metadata server (127.0.0.1 only)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from cmdare.cloud.notice_protocol import AWS_REBALANCE_PATH
from cmdare.cloud.notices import AWS_NOTICE_S, GCE_NOTICE_S, GCE_PATH, LocalMetadataServer, Notice, NoticeWatcher
from cmdare.errors import UnknownNameError, UserInputError

POLL_S = 0.2
_open = urllib.request.build_opener(urllib.request.ProxyHandler({})).open  # never via a proxy


@pytest.fixture()
def server():
    with LocalMetadataServer() as srv:
        yield srv


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_local_server_speaks_the_gce_protocol(server):
    assert server.gce_url.startswith("http://127.0.0.1:")
    req = urllib.request.Request(server.gce_url, headers={"Metadata-Flavor": "Google"})
    with _open(req, timeout=2) as resp:
        assert resp.read() == b"FALSE" and resp.headers["Metadata-Flavor"] == "Google"
    with pytest.raises(urllib.error.HTTPError) as info:  # the header is mandatory, as on GCE
        _open(server.gce_url, timeout=2)
    assert info.value.code == 403
    server.preempt()
    with _open(req, timeout=2) as resp:
        assert resp.read() == b"TRUE"


def test_local_server_speaks_imdsv2(server):
    with pytest.raises(urllib.error.HTTPError) as info:  # no token: 401
        _open(server.aws_url, timeout=2)
    assert info.value.code == 401
    put = urllib.request.Request(server.base_url + "/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    with _open(put, timeout=2) as resp:
        token = resp.read().decode()
    get = urllib.request.Request(server.aws_url, headers={"X-aws-ec2-metadata-token": token})
    with pytest.raises(urllib.error.HTTPError) as info:  # no interruption scheduled: 404
        _open(get, timeout=2)
    assert info.value.code == 404
    server.preempt()
    with _open(get, timeout=2) as resp:
        doc = json.loads(resp.read())
    assert doc["action"] == "terminate" and doc["time"].endswith("Z")
    assert server.requests["/latest/api/token"] == 1


@pytest.mark.parametrize("provider", ["gce", "aws"])
def test_watcher_detects_a_flip_at_the_next_poll(server, provider):
    """The flip is seen by the first poll sent after it (the delay in seconds: bench/notice_latency.py)."""
    seen: list[Notice] = []
    called = threading.Event()
    watcher = NoticeWatcher(server.url_for(provider), provider, poll_interval_s=POLL_S,
                            on_notice=lambda n: (seen.append(n), called.set()))
    with watcher:
        assert _wait_for(lambda: watcher.polls >= 2, 10.0)
        assert watcher.notice is None and watcher.errors == 0, watcher.last_error
        polls_before = watcher.polls  # one more may start before the flip and answer "not preempted"
        server.preempt()
        flipped = server.preempted_at
        assert called.wait(10.0)
        notice = watcher.notice
        assert watcher.polls <= polls_before + 2, (polls_before, watcher.polls)
    assert notice.detected_at >= flipped  # never before the flip
    assert seen == [notice] and notice.provider == provider
    if provider == "gce":
        assert notice.deadline == pytest.approx(notice.detected_at + GCE_NOTICE_S)
        assert notice.raw == "TRUE" and notice.action == "preempt"
    else:  # the deadline comes from the document's time field (whole seconds)
        assert notice.deadline == pytest.approx(flipped + AWS_NOTICE_S, abs=1.0)
        assert notice.action == "terminate"
        assert server.requests["/latest/api/token"] == 1  # the IMDSv2 token is reused across polls
    assert 0 < notice.time_left_s(now=notice.detected_at) <= max(GCE_NOTICE_S, AWS_NOTICE_S)
    assert not watcher.running


def test_an_aws_rebalance_recommendation_is_a_risk_not_a_notice_and_the_watcher_keeps_polling(server):
    seen: list[Notice] = []
    watcher = NoticeWatcher(server.aws_url, "aws", poll_interval_s=POLL_S, on_notice=seen.append)
    with watcher:
        assert _wait_for(lambda: server.requests.get(AWS_REBALANCE_PATH, 0) >= 1, 10.0)
        assert watcher.risk is None and watcher.errors == 0, watcher.last_error
        server.recommend_rebalance()
        assert _wait_for(lambda: watcher.risk is not None, 10.0)
        risk = watcher.risk
        assert risk.provider == "aws" and risk.action == "rebalance" and watcher.notice is None and not seen
        assert risk.deadline == pytest.approx(risk.detected_at + AWS_NOTICE_S, abs=1.0)  # the soonest it can go
        asked = server.requests[AWS_REBALANCE_PATH]
        server.preempt()  # the interruption notice comes later: still seen
        assert _wait_for(lambda: watcher.notice is not None, 10.0)
    assert seen == [watcher.notice] and watcher.notice.action == "terminate"
    assert server.requests[AWS_REBALANCE_PATH] == asked  # once seen, the recommendation is not asked again
    assert server.requests["/latest/api/token"] == 1


def test_delayed_preemption_and_gce_wait_for_change(server):
    watcher = NoticeWatcher(server.gce_url, "gce", poll_interval_s=1.0, wait_for_change=True).start()
    try:
        server.preempt(delay_s=0.3)
        assert not server.preempted
        assert _wait_for(lambda: watcher.notice is not None, 10.0)
        # a long poll answers as soon as the value changes, not at the next 1 s poll: the one request that
        # was waiting when the value flipped brought the notice (polling would need a second request)
        assert watcher.polls == 1 and server.requests[GCE_PATH] == 1
        assert watcher.notice.detected_at >= server.preempted_at  # how soon after: bench/notice_latency.py
    finally:
        watcher.stop()


def test_unreachable_endpoint_is_counted_and_retried_without_crashing():
    url = f"http://127.0.0.1:{_closed_port()}/computeMetadata/v1/instance/preempted"
    watcher = NoticeWatcher(url, "gce", poll_interval_s=0.05, max_backoff_s=0.2, timeout_s=0.5).start()
    try:
        assert _wait_for(lambda: watcher.errors >= 3, 3.0)
        assert watcher.running and watcher.notice is None
        assert "URLError" in (watcher.last_error or "")
    finally:
        watcher.stop()  # how fast it stops: bench/notice_latency.py
    assert not watcher.running


def test_endpoint_that_comes_back_is_picked_up_and_a_failing_callback_is_contained(server):
    port = server.port
    server.stop()  # endpoint down
    watcher = NoticeWatcher(f"http://127.0.0.1:{port}/latest/meta-data/spot/instance-action", "aws",
                            poll_interval_s=0.05, max_backoff_s=0.1,
                            on_notice=lambda n: 1 / 0).start()
    try:
        assert _wait_for(lambda: watcher.errors >= 2, 3.0)
        revived = LocalMetadataServer(port=port).start()  # back up, already preempted
        try:
            revived.preempt()
            assert _wait_for(lambda: watcher.notice is not None, 3.0)
            assert _wait_for(lambda: watcher.callback_errors == 1, 1.0)
            assert watcher.consecutive_errors == 0
        finally:
            revived.stop()
    finally:
        watcher.stop()


def test_bad_arguments():
    with pytest.raises(UnknownNameError):
        NoticeWatcher("http://127.0.0.1:1/x", provider="azure")
    with pytest.raises(UserInputError):
        NoticeWatcher("ftp://127.0.0.1/x", provider="gce")
    with pytest.raises(UserInputError):
        NoticeWatcher("http://127.0.0.1:1/x", provider="gce", poll_interval_s=0)
    default = NoticeWatcher(provider="aws")  # never started: the real endpoint is not contacted
    assert default.url == "http://169.254.169.254/latest/meta-data/spot/instance-action"
    with pytest.raises(UserInputError):
        LocalMetadataServer().port  # noqa: B018 - not started


def test_watcher_from_env(server):
    from cmdare.cloud.notices import watcher_from_env

    assert watcher_from_env(environ={}) is None
    watcher = watcher_from_env(poll_interval_s=0.05, environ={"CMDARE_NOTICE_PROVIDER": "aws",
                                                              "CMDARE_NOTICE_URL": server.aws_url})
    assert watcher is not None and watcher.provider == "aws" and watcher.url == server.aws_url
    server.preempt()
    with watcher:
        assert _wait_for(lambda: watcher.notice is not None, 2.0)
    with pytest.raises(UnknownNameError):
        watcher_from_env(environ={"CMDARE_NOTICE_PROVIDER": "azure"})


def _raw(port: int, request: bytes, timeout_s: float = 10.0) -> bytes:
    """The whole answer to ``request`` (the server closes these connections after answering)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


@pytest.mark.parametrize("timeout_sec", ["abc", "-1", "nan", "1e9"])
def test_a_malformed_long_poll_is_answered_400(server, timeout_sec, caplog):
    """Issue 29: timeout_sec=abc dropped the connection with a server-side traceback."""
    req = urllib.request.Request(f"{server.gce_url}?wait_for_change=true&timeout_sec={timeout_sec}",
                                 headers={"Metadata-Flavor": "Google"})
    with pytest.raises(urllib.error.HTTPError) as info:
        _open(req, timeout=5)
    assert info.value.code == 400 and b"timeout_sec must be a number of seconds" in info.value.read()
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("length", [b"abc", b"-5", b"99999999999"])
def test_a_bad_content_length_is_answered_400(server, length):
    answer = _raw(server.port, b"PUT /latest/api/token HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n"
                  b"X-aws-ec2-metadata-token-ttl-seconds: 60\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"Content-Length must be a whole number" in answer


def test_long_polls_hold_a_bounded_number_of_threads(server):
    """Issue 29: 300 long-polls held 303 threads; beyond the bound a connection is answered 503 at once."""
    from cmdare.cloud.metadata_server import MAX_CONNECTIONS

    before = threading.active_count()
    polls = []
    for _ in range(MAX_CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(f"GET {GCE_PATH}?wait_for_change=true&timeout_sec=30 HTTP/1.1\r\nHost: x\r\n"
                     "Metadata-Flavor: Google\r\n\r\n".encode())
        polls.append(sock)
    try:
        assert _wait_for(lambda: threading.active_count() >= before + MAX_CONNECTIONS, 10)
        answer = _raw(server.port, f"GET {GCE_PATH} HTTP/1.1\r\nHost: x\r\nMetadata-Flavor: Google\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 503")
        assert threading.active_count() <= before + MAX_CONNECTIONS
        server.preempt()  # every long-poll answers and its thread ends
        assert all(s.recv(4096).startswith(b"HTTP/1.1 200") for s in polls)
    finally:
        for sock in polls:
            sock.close()
    assert _wait_for(lambda: threading.active_count() <= before + 1, 10)
    req = urllib.request.Request(server.gce_url, headers={"Metadata-Flavor": "Google"})
    with _open(req, timeout=5) as resp:  # and new connections are served again
        assert resp.read() == b"TRUE"
