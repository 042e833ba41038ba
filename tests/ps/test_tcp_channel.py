"""The TCP carrier of the channel protocol on its own (no Ray): 127.0.0.1, each channel served on a thread."""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import threading
import time
import tracemalloc

import numpy as np
import pytest

from cmdare.ps import channel as channel_module
from cmdare.ps import tcp_channel
from cmdare.ps.channel import ChannelClient, ChannelClosed, ChannelRefused, ChannelServer, receive_all
from cmdare.ps.shard_state import complement
from cmdare.ps.tcp_channel import TcpChannelAddress, TcpChannelClient, TcpChannelServer

HOST = "127.0.0.1"
LR = np.float32(0.05)
# step -> pieces (offset, count) sent ahead of that step's push, in the order they are sent
PIECES = {1: [(300, 150), (0, 100)], 3: [(900, 100), (100, 50), (500, 1)], 4: [(0, 1000)]}


def _start(n: int) -> np.ndarray:
    return np.linspace(-1, 1, n, dtype=np.float32)


class _Sgd:
    """A toy shard: one session per channel, each over its own parameters (``params -= lr * grad``)."""

    def __init__(self, stream: bool = True):
        self.sessions: list[_SgdSession] = []
        self.stream = stream  # a piece's parameters are final at once (an asynchronous shard's session)
        self.closed = 0
        self.fail_next: Exception | None = None  # the next push raises it
        self.lock = threading.Lock()

    def connect(self, grad, out):
        session = _SgdSession(self, grad, out)
        with self.lock:
            self.sessions.append(session)
        return session

    def wait_closed(self, n: int) -> None:
        deadline = time.monotonic() + 10
        while self.closed < n and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.closed == n


class _SgdSession:
    """Asynchronous style: a piece is applied (and its parameters written) at once, the push applies the rest."""

    def __init__(self, owner: _Sgd, grad, out):
        self.owner, self.grad, self.out = owner, grad, out
        self.params = _start(grad.size)
        self.done: list[tuple[int, int]] = []
        self.step = 0
        self.calls: list[tuple] = []

    def _apply(self, lo: int, hi: int) -> None:
        self.params[lo:hi] -= LR * self.grad[lo:hi]
        self.out[lo:hi] = self.params[lo:hi]

    def piece(self, offset, count, pulled_step, sender):
        self._apply(offset, offset + count)
        self.done.append((offset, offset + count))
        return (offset, offset + count) if self.owner.stream else None

    def push(self, pulled_step, sent_at, sender, sent):
        failure, self.owner.fail_next = self.owner.fail_next, None
        if failure is not None:
            self.done = []
            raise failure
        assert sent == sum(hi - lo for lo, hi in self.done)
        for lo, hi in complement(self.done, self.params.size):
            self._apply(lo, hi)
        self.done = []
        self.step += 1
        self.calls.append((pulled_step, sent_at, sender, sent))
        return self.step, True

    def close(self):
        with self.owner.lock:
            self.owner.closed += 1


def _gradients(n: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]


def _reference(n: int, grads: list[np.ndarray]) -> list[np.ndarray]:
    p, out = _start(n), []
    for g in grads:
        p = p - LR * g
        out.append(p)
    return out


def _direct(n: int, grads: list[np.ndarray]) -> list[np.ndarray]:
    """The session driven by hand: no carrier at all."""
    grad, out = np.zeros(n, np.float32), np.zeros(n, np.float32)
    session, results = _Sgd().connect(grad, out), []
    for t, g in enumerate(grads):
        pieces = PIECES.get(t, []) if n == 1000 else []
        grad[:] = g
        for offset, count in pieces:
            session.piece(offset, count, t, 0)
        session.push(t, None, 0, sum(c for _, c in pieces))
        results.append(out.copy())
    return results


def _drive(client, params: np.ndarray, grads_buf: np.ndarray, grads: list[np.ndarray]) -> list[np.ndarray]:
    """A worker's steps over ``client`` (either carrier): pieces from backward, then the push and its reply."""
    results = []
    for t, g in enumerate(grads):
        pieces = PIECES.get(t, []) if params.size == 1000 else []
        grads_buf[:] = g
        for offset, count in pieces:
            client.send_piece(offset, count, t, 0)
        client.send(t, 12.5, 0, sum(c for _, c in pieces))
        assert client.receive() == (t + 1, True)
        results.append(params.copy())
    return results


def _honest_step(server: TcpChannelServer, n: int = 8) -> None:
    """A fresh worker with the secret is served correctly."""
    params, grads = np.zeros(n, np.float32), np.ones(n, np.float32)
    client = TcpChannelClient(server.address, params, grads)
    try:
        client.send(0, None, 0)
        assert client.receive() == (1, True)
        assert np.array_equal(params, _start(n) - LR * grads)
    finally:
        client.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closes ``sock`` (within 10 s), after whatever it sent before (a piece's parameters)."""
    sock.settimeout(10)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# -- exactness ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [True, False], ids=["pieces-streamed-back", "all-with-the-reply"])
def test_tcp_gives_bit_identical_parameters_to_the_session_driven_directly_and_to_the_unix_carrier(stream):
    n, grads = 1000, _gradients(1000, 6)
    direct = _direct(n, grads)
    state = _Sgd(stream)
    server = TcpChannelServer(state.connect, HOST)
    params, grads_buf = np.zeros(n, np.float32), np.zeros(n, np.float32)
    client = TcpChannelClient(server.address, params, grads_buf)
    try:
        over_tcp = _drive(client, params, grads_buf, grads)
        assert state.sessions[0].calls[1] == (1, 12.5, 0, 250)
    finally:
        client.close()
        server.close()
    for a, b, c in zip(direct, over_tcp, _reference(n, grads), strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    if channel_module.channels_enabled():
        memory = channel_module.SharedHostMemory(n)
        unix_server = ChannelServer(_Sgd().connect)
        unix = ChannelClient(unix_server.address, memory, 0, n)
        try:
            over_unix = _drive(unix, memory.params.numpy(), memory.grads.numpy(), grads)
        finally:
            unix.close()
            unix_server.close()
            memory.close()
        assert all(np.array_equal(a, b) for a, b in zip(over_tcp, over_unix, strict=True))


def test_several_clients_at_once_each_get_their_own_results():
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    sizes = [1000, 17, 250_000, 1000, 3]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(sizes))

    def worker(i: int, n: int) -> None:
        try:
            grads = _gradients(n, 5, seed=i)
            params, buf = np.zeros(n, np.float32), np.zeros(n, np.float32)
            client = TcpChannelClient(server.address, params, buf)
            barrier.wait(10)
            try:
                for got, want in zip(_drive(client, params, buf, grads), _reference(n, grads), strict=True):
                    assert np.array_equal(got, want)
            finally:
                client.close()
        except BaseException as err:  # noqa: BLE001 - reported by the test's thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i, n)) for i, n in enumerate(sizes)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert len(state.sessions) == len(sizes)
        # one worker, several channels: receive_all gathers TCP clients as it does Unix ones
        bufs = [(np.zeros(n, np.float32), np.full(n, 2.0, np.float32)) for n in (4, 5)]
        clients = {k: TcpChannelClient(server.address, p, g) for k, (p, g) in enumerate(bufs)}
        for c in clients.values():
            c.send(0, None, 0)
        wait = [0.0, 0.0]
        assert receive_all(clients, time.perf_counter(), wait) == {0: (1, True), 1: (1, True)}
        assert all(np.array_equal(p, _start(p.size) - LR * g) for p, g in bufs)
        for c in clients.values():
            c.close()
    finally:
        server.close()


def test_a_failing_push_raises_in_the_worker_and_the_channel_stays_usable():
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    params, grads = np.zeros(4, np.float32), np.ones(4, np.float32)
    client = TcpChannelClient(server.address, params, grads)
    try:
        state.fail_next = ValueError("3 values for 4")
        client.send_piece(1, 2, 0, 0)
        client.send(0, None, 0, sent=2)
        with pytest.raises(RuntimeError, match="ValueError: 3 values for 4"):
            client.receive()
        with pytest.raises(ValueError):  # a push must count the pieces this channel sent
            client.send(0, None, 0, sent=1)
        client.send(0, None, 0)
        assert client.receive() == (1, True)
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("stream", [True, False], ids=["pieces-streamed-back", "all-with-the-reply"])
def test_a_10_mb_model_with_and_without_pieces_arrives_whole_and_bit_identical(stream):
    """Buffers far larger than a socket's (one MSG_WAITALL receive each) arrive whole, in either direction."""
    n, steps = 2_500_000, 3
    grads = _gradients(n, steps)
    state = _Sgd(stream)
    server = TcpChannelServer(state.connect, HOST)
    params, buf = np.zeros(n, np.float32), np.zeros(n, np.float32)
    client = TcpChannelClient(server.address, params, buf)
    try:
        for t, (g, want) in enumerate(zip(grads, _reference(n, grads), strict=True)):
            buf[:] = g
            pieces = [(n // 2, n // 3), (7, 1_000_001)] if t == 1 else []
            for offset, count in pieces:
                client.send_piece(offset, count, t, 0)
            client.send(t, None, 0, sum(c for _, c in pieces))
            assert client.receive() == (t + 1, True)
            assert np.array_equal(params, want)
    finally:
        client.close()
        server.close()


def test_a_pieces_parameters_come_back_before_the_push_is_sent():
    """The shard streams a piece's updated parameters back at once: the worker can read them while it is still
    sending the rest of its gradient."""
    n = 1000
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    params, grads = np.zeros(n, np.float32), np.ones(n, np.float32)
    client = TcpChannelClient(server.address, params, grads)
    try:
        client.send_piece(200, 300, 0, 0)
        ready, _, _ = select.select([client.sock], [], [], 10)
        assert ready, "no parameters came back for the piece before the push"
        assert np.all(params == 0)  # they wait in the socket until receive()
        client.send(0, None, 0, sent=300)
        assert client.receive() == (1, True)
        assert np.array_equal(params, _start(n) - LR * grads)
    finally:
        client.close()
        server.close()


def test_recv_into_exact_fills_from_bursts_and_reports_a_peer_that_closes_midway():
    a, b = socket.socketpair()
    payload = np.arange(300_000, dtype=np.float32)
    raw = memoryview(payload).cast("B")

    def bursts(upto: int, then_close: bool) -> None:
        for lo in range(0, upto, 100_003):
            a.sendall(raw[lo:min(lo + 100_003, upto)])
            time.sleep(0.002)
        if then_close:
            a.shutdown(socket.SHUT_WR)

    try:
        got = np.zeros_like(payload)
        for upto, closes in ((len(raw), False), (len(raw) // 2, True)):
            writer = threading.Thread(target=bursts, args=(upto, closes))
            writer.start()
            try:
                if closes:
                    with pytest.raises(ChannelClosed):
                        tcp_channel.recv_into_exact(b, got)
                else:
                    tcp_channel.recv_into_exact(b, got)
                    assert np.array_equal(got, payload)
            finally:
                writer.join(10)
    finally:
        a.close()
        b.close()


def test_closing_the_server_closes_its_channels():
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    params, grads = np.zeros(4, np.float32), np.ones(4, np.float32)
    client = TcpChannelClient(server.address, params, grads)
    client.send(0, None, 0)
    assert client.receive() == (1, True)
    server.close()
    state.wait_closed(1)
    with pytest.raises(ChannelClosed):
        client.send(0, None, 0)
        client.receive()
    client.close()
    with pytest.raises(OSError):
        TcpChannelClient(server.address, params, grads)


# -- security ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "0"])
def test_a_wildcard_address_is_refused(host):
    with pytest.raises(ValueError):
        TcpChannelServer(_Sgd().connect, host)


def test_peers_without_the_secret_are_refused_logged_and_change_nothing(monkeypatch, caplog):
    monkeypatch.setattr(tcp_channel, "_HANDSHAKE_S", 0.2)
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    address = server.address
    try:
        with caplog.at_level(logging.WARNING, logger="cmdare.ps.tcp_channel"):
            silent = socket.create_connection((HOST, address.port), timeout=10)
            assert len(silent.recv(64)) == 32  # the challenge, then nothing from it: dropped at the timeout
            assert _closed_by_peer(silent)
            silent.close()
            noisy = socket.create_connection((HOST, address.port), timeout=10)
            assert len(noisy.recv(64)) == 32
            noisy.sendall(os.urandom(tcp_channel._HELLO_BYTES))
            assert _closed_by_peer(noisy)
            noisy.close()
            params, grads = np.full(6, 7.0, np.float32), np.full(6, np.nan, np.float32)
            for secret in (b"", b"\0" * 32, address.secret[:-1] + bytes([address.secret[-1] ^ 1])):
                with pytest.raises(ChannelRefused):
                    TcpChannelClient(TcpChannelAddress(HOST, address.port, secret), params, grads)
            assert server.refused == 5
            _honest_step(server)
        assert len(state.sessions) == 1 and np.all(params == 7.0)  # only the honest worker got a session
        assert caplog.text.count("refused a channel from 127.0.0.1:") == 5
        assert "no hello within 0.2 s" in caplog.text
        assert caplog.text.count("did not prove the channel's secret") == 4
        assert address.secret.hex() not in caplog.text and repr(address.secret) not in caplog.text
        assert "secret" not in repr(address) and str(address.port) in repr(address)
    finally:
        server.close()


def test_proven_but_malformed_hellos_are_refused():
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    try:
        for count in (0, -5, 2**40):
            sock = socket.create_connection((HOST, server.address.port), timeout=10)
            challenge = sock.recv(32)
            hello = channel_module._HELLO.pack(0, 0, count)
            proven = hello + channel_module._mac(server.address.secret, challenge, hello) + os.urandom(32)
            sock.sendall(proven.ljust(tcp_channel._HELLO_BYTES, b"\0"))
            assert _closed_by_peer(sock)
            sock.close()
        assert server.refused == 3 and state.sessions == []
        _honest_step(server)
    finally:
        server.close()


@pytest.mark.parametrize("answer", [b"", b"\0" * 32, None], ids=["no-proof", "a-wrong-proof", "the-ack-alone"])
def test_a_worker_sends_nothing_to_a_peer_that_does_not_prove_the_shards_secret(answer):
    """Something else on the port of a shard that went away (it acks, but cannot prove the secret): the worker
    refuses it before its first push, so no gradient leaves and no parameter comes in."""
    secret = os.urandom(32)
    listener = socket.create_server((HOST, 0))
    got: list[bytes] = []

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(os.urandom(32))
            got.append(conn.recv(1 << 16))
            conn.sendall(tcp_channel._DOWN.pack(channel_module._APPLIED, 0, 0, 0) + (answer or b""))
            if answer is None:
                conn.sendall(tcp_channel._DOWN.pack(tcp_channel._PARAMS, 0, 0, 4) + np.ones(4, np.float32).tobytes())
            time.sleep(0.2 if answer else 0)
            try:
                got.append(conn.recv(1 << 16))
            except ConnectionResetError:  # closed with the impostor's bytes unread
                got.append(b"")

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    params = np.zeros(4, np.float32)
    try:
        with pytest.raises(ChannelRefused, match="not the shard|in time"):
            TcpChannelClient(TcpChannelAddress(HOST, listener.getsockname()[1], secret), params,
                             np.ones(4, np.float32), timeout=1)
        thread.join(10)
    finally:
        listener.close()
    assert len(got[0]) == tcp_channel._HELLO_BYTES  # hello, proof, nonce
    assert got[1] == b""  # then the worker closed: no request, no gradient
    assert np.all(params == 0)


def _request(kind: int, count: int, offset: int = 0) -> bytes:
    return tcp_channel._UP.pack(kind, 0, math.nan, 0, count, offset)


def test_a_truncated_frame_closes_only_that_connection():
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    params, grads = np.zeros(64, np.float32), np.ones(64, np.float32)
    honest = TcpChannelClient(server.address, params, grads)
    try:
        honest.send(0, None, 0)
        assert honest.receive() == (1, True)
        frames = [_request(channel_module._PIECE, 500, 100) + b"\0" * 1000,  # half of a piece
                  _request(channel_module._PUSH, 0) + b"\0" * 2000,  # half of a push
                  _request(channel_module._PUSH, 0)[:20]]  # half of a request
        for i, frame in enumerate(frames, 1):
            peer = TcpChannelClient(server.address, np.zeros(1000, np.float32), np.zeros(1000, np.float32))
            peer.sock.sendall(frame)
            peer.close()
            state.wait_closed(i)
        assert all(s.calls == [] for s in state.sessions[1:])
        assert server.dropped == 0 and server.refused == 0  # a peer that went away mid-frame is no offence
        honest.send(1, None, 0)
        assert honest.receive() == (2, True)
        assert np.array_equal(params, _start(64) - LR * grads - LR * grads)
        _honest_step(server)
    finally:
        honest.close()
        server.close()


def test_frames_claiming_more_than_their_range_close_the_connection_without_allocating(caplog):
    state = _Sgd()
    server = TcpChannelServer(state.connect, HOST)
    params, grads = np.zeros(64, np.float32), np.ones(64, np.float32)
    honest = TcpChannelClient(server.address, params, grads)
    piece, push = channel_module._PIECE, channel_module._PUSH
    frames = [_request(piece, 2_500_000_000),  # a 10 GB piece
              _request(push, 2_500_000_000),  # a push counting 10 GB of pieces it never sent
              _request(piece, 2, 0) + b"\0" * 64 + _request(push, 3),  # a push miscounting its pieces (8 bytes, padded)
              _request(piece, 2, 0) + b"\0" * 64 + _request(piece, 2, 1),  # overlapping pieces
              _request(piece, 2, -1), _request(piece, 0, 1), _request(piece, 1, 4),  # outside [0, 4)
              _request(7, 2_500_000_000)]  # an unknown kind
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="cmdare.ps.tcp_channel"):
            for frame in frames:
                peer = TcpChannelClient(server.address, np.zeros(4, np.float32), np.zeros(4, np.float32))
                peer.sock.sendall(frame)
                assert _closed_by_peer(peer.sock)
                peer.close()
            state.wait_closed(len(frames))
        assert tracemalloc.get_traced_memory()[1] < 32 << 20  # nothing near what the frames claimed
        assert server.dropped == len(frames) and server.refused == 0
        assert caplog.text.count("closed the channel from 127.0.0.1:") == len(frames)
        assert all(s.calls == [] for s in state.sessions[1:])
        honest.send(0, None, 0)
        assert honest.receive() == (1, True)
        assert np.array_equal(params, _start(64) - LR * grads)
    finally:
        tracemalloc.stop()
        honest.close()
        server.close()
