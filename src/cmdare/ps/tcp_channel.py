"""The cross-node data path between a worker and a shard: channel.py's protocol over TCP.

One protocol, two carriers: :mod:`cmdare.ps.channel` carries it within a node (a Unix socket; the gradient
and parameters stay in shared memory); this module carries the same frames between nodes, each followed by
the values it names, sent from and received into numpy buffers (``sendmsg`` / ``recv_into``, no copy).

Handshake: the shard's 32-byte challenge; the worker's ``_HELLO`` (0, 0, element count) and
HMAC-SHA256(secret, challenge + hello); the shard allocates the connection's own ``grad`` and ``out``, makes
its :class:`~cmdare.ps.channel.Session` and acks (APPLIED, step 0). A PIECE request is followed by its
``count`` gradient elements; a PUSH (``count``: elements already sent as pieces) by the elements its pieces
left, ascending; its reply by all the parameters (applied or not), or FAILED by a message of ``step`` bytes.

The shard binds its node's address only and serves only peers that prove the secret, which reaches workers
through Ray (:class:`TcpChannelAddress` never shows it). A peer that breaks the protocol (a frame outside its
range, overlapping pieces, a miscounted push, a truncated frame) loses its own connection; nothing is
allocated from a length a peer claims. The handshake authenticates the worker, not the bytes that follow:
the cluster network is trusted not to rewrite packets.
"""

from __future__ import annotations

import bisect
import contextlib
import hmac
import ipaddress
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cmdare.ps.channel import (
    _APPLIED,
    _FAILED,
    _HANDSHAKE_S,
    _HELLO,
    _MAC_BYTES,
    _NONCE_BYTES,
    _NOT_APPLIED,
    _PIECE,
    _PUSH,
    _REPLY,
    _REQUEST,
    ChannelClosed,
    ChannelRefused,
    Connect,
    Session,
    _mac,
)
from cmdare.ps.shard_state import complement

__all__ = ["TcpChannelAddress", "TcpChannelClient", "TcpChannelServer", "recv_into_exact", "tcp_channels_enabled"]


def tcp_channels_enabled() -> bool:
    """Whether workers reach a shard on another node over its TCP channel; ``CMDARE_TCP=0`` turns it off,
    leaving every push and pull to another node to Ray's calls and object store."""
    return os.environ.get("CMDARE_TCP", "1").strip().lower() not in ("0", "false", "no", "off")

log = logging.getLogger(__name__)

_MAX_COUNT = 2**31  # elements a hello may ask for (8 GiB of float32 per buffer)
_MAX_MESSAGE = 1 << 16  # bytes of a FAILED reply's message
# SO_SNDBUF / SO_RCVBUF, or None: Linux's autotuning, which grows each buffer to what the path needs (up to
# net.ipv4.tcp_{w,r}mem's maximum). Measured on loopback, 2 cores, 10 MB each way: fixed 4 MiB buffers 1.2x
# slower than autotuning; fixed 256 KiB-1 MiB 0-15% faster there (the bytes in flight stay in cache), but such a
# buffer caps a real link at its size per round trip (1 MiB at 0.5 ms: 2 GB/s), so autotuning it is.
_BUFFER_BYTES: int | None = None
_WAITALL = getattr(socket, "MSG_WAITALL", 0)  # one recv, one wake-up, for a whole gradient or reply
_IOV_MAX = 512  # buffers per sendmsg


@dataclass(frozen=True)
class TcpChannelAddress:
    """Where a shard's TCP channel listens and the secret a worker proves to use it (never in a repr)."""

    host: str
    port: int
    secret: bytes = field(repr=False)


class _Dropped(Exception):
    """A peer broke the protocol: its connection is closed."""


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request's or reply's tail goes at once
    if _BUFFER_BYTES:
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)


def recv_into_exact(sock: socket.socket, view, deadline: float | None = None) -> None:
    """Fill the buffer ``view`` from ``sock`` (before ``deadline``, a ``time.monotonic()`` time, when given:
    else :class:`TimeoutError`); :class:`ChannelClosed` when the peer closes first.

    On a blocking socket one ``MSG_WAITALL`` receive fills the whole buffer (the kernel copies as the data
    comes, with the GIL released throughout): a few system calls per 10 MB instead of one per arrival."""
    view = memoryview(view).cast("B")
    pos = 0
    while pos < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the peer did not send in time")
            sock.settimeout(left)
        n = sock.recv_into(view[pos:], 0, _WAITALL if deadline is None else 0)
        if n == 0:
            raise ChannelClosed("the channel's peer closed it")
        pos += n


def _send_all(sock: socket.socket, buffers: Sequence) -> None:
    """Send every buffer, in order, with as few system calls as the socket allows."""
    views = [v for v in (memoryview(b).cast("B") for b in buffers) if len(v)]
    while views:
        n = sock.sendmsg(views[:_IOV_MAX])
        while n:
            if n >= len(views[0]):
                n -= len(views.pop(0))
            else:
                views[0], n = views[0][n:], 0


def _slot(ranges: list[tuple[int, int]], lo: int, hi: int, n: int) -> int | None:
    """Where ``[lo, hi)`` goes in the sorted disjoint ``ranges`` (None: outside ``[0, n)``, empty, or overlapping)."""
    if lo < 0 or hi <= lo or hi > n:
        return None
    i = bisect.bisect_left(ranges, (lo, hi))
    if (i > 0 and ranges[i - 1][1] > lo) or (i < len(ranges) and ranges[i][0] < hi):
        return None
    return i


def _resolve(host: str) -> tuple[int, str]:
    """(address family, address) of the one address a server binds; a wildcard is refused."""
    if host.strip() in ("", "0.0.0.0", "::"):
        raise ValueError(f"a shard's channel binds its node's address, not {host!r}")
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    if ipaddress.ip_address(sockaddr[0].split("%")[0]).is_unspecified:
        raise ValueError(f"a shard's channel binds its node's address, not {host!r}")
    return family, sockaddr[0]


class TcpChannelServer:
    """The shard's end over TCP: serves each worker that proves :attr:`address`'s secret on a thread of its
    own, through the :class:`~cmdare.ps.channel.Session` that ``connect(grad, out)`` makes for it."""

    def __init__(self, connect: Connect, host: str):
        family, bind_at = _resolve(host)
        self._connect = connect
        self.refused = 0  # handshakes refused (no or wrong proof, malformed hello)
        self.dropped = 0  # proven connections closed for breaking the protocol
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            _tune(self._listener)  # accepted connections inherit the buffer sizes (and so the TCP window)
            self._listener.bind((bind_at, 0))
            self._listener.listen(64)
        except BaseException:
            self._listener.close()
            raise
        self.address = TcpChannelAddress(host, self._listener.getsockname()[1], os.urandom(32))
        threading.Thread(target=self._accept, name="cmdare-tcp-channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._connection, args=(conn, f"{peer[0]}:{peer[1]}"),
                             name="cmdare-tcp-channel", daemon=True).start()

    def _connection(self, conn: socket.socket, peer: str) -> None:
        session: Session | None = None
        try:
            with conn:
                _tune(conn)
                count = self._handshake(conn, peer)
                if count is None:
                    return
                grad, out = np.zeros(count, np.float32), np.zeros(count, np.float32)
                session = self._connect(grad, out)
                conn.sendall(_REPLY.pack(_APPLIED, 0))
                self._serve(conn, session, grad, out)
        except _Dropped as err:
            with self._lock:
                self.dropped += 1
            log.warning("closed the channel from %s: %s", peer, err)
        except OSError:  # the peer went away (ChannelClosed too), or the server closed
            pass
        except Exception:  # noqa: BLE001 - e.g. connect failed: this connection ends, the shard stays
            log.exception("the channel from %s failed", peer)
        finally:
            with self._lock:
                self._conns.discard(conn)
            if session is not None:
                session.close()

    def _handshake(self, conn: socket.socket, peer: str) -> int | None:
        """The element count of a peer that proved the secret with a sound hello (None: refused)."""
        challenge = os.urandom(_NONCE_BYTES)
        message = bytearray(_HELLO.size + _MAC_BYTES)
        try:
            conn.settimeout(_HANDSHAKE_S)
            conn.sendall(challenge)
            recv_into_exact(conn, message, deadline=time.monotonic() + _HANDSHAKE_S)
        except TimeoutError:
            why = f"no hello within {_HANDSHAKE_S:g} s"
        except OSError:
            why = "it closed before its hello"
        else:
            hello = bytes(message[:_HELLO.size])
            if not hmac.compare_digest(bytes(message[_HELLO.size:]), _mac(self.address.secret, challenge, hello)):
                why = "it did not prove the channel's secret"
            else:
                count = _HELLO.unpack(hello)[2]
                if 1 <= count <= _MAX_COUNT:
                    conn.settimeout(None)
                    return count
                why = f"a hello of {count} elements (1 to {_MAX_COUNT})"
        with self._lock:
            self.refused += 1
        log.warning("refused a channel from %s: %s", peer, why)
        return None

    @staticmethod
    def _serve(conn: socket.socket, session: Session, grad: np.ndarray, out: np.ndarray) -> None:
        n = grad.size
        header = bytearray(_REQUEST.size)
        ranges: list[tuple[int, int]] = []  # this push's pieces so far, sorted
        sent = 0
        failed: Exception | None = None  # a piece that failed is reported with the push
        while True:
            recv_into_exact(conn, header)
            kind, pulled, sent_at, sender, count, offset = _REQUEST.unpack(header)
            pulled_step, who = None if pulled < 0 else pulled, None if sender < 0 else sender
            if kind == _PIECE:
                i = _slot(ranges, offset, offset + count, n)
                if i is None:
                    raise _Dropped(f"a piece of {count} elements at {offset}: outside [0, {n}) or overlapping "
                                   f"{len(ranges)} earlier pieces")
                recv_into_exact(conn, grad[offset:offset + count])
                ranges.insert(i, (offset, offset + count))
                sent += count
                if failed is None:
                    try:
                        session.piece(offset, count, pulled_step, who)
                    except Exception as err:  # noqa: BLE001 - the worker raises it with the push
                        failed = err
                continue
            if kind != _PUSH:
                raise _Dropped(f"a request of unknown kind {kind}")
            if count != sent:
                raise _Dropped(f"a push counting {count} elements sent as pieces, not {sent}")
            for lo, hi in complement(ranges, n):
                recv_into_exact(conn, grad[lo:hi])
            ranges, sent = [], 0
            try:
                if failed is not None:
                    raise failed
                step, applied = session.push(pulled_step, None if math.isnan(sent_at) else sent_at, who, count)
            except Exception as err:  # noqa: BLE001 - the worker raises it
                failed = None
                message = f"{type(err).__name__}: {err}".encode()[:_MAX_MESSAGE]
                conn.sendall(_REPLY.pack(_FAILED, len(message)) + message)
                continue
            _send_all(conn, [_REPLY.pack(_APPLIED if applied else _NOT_APPLIED, step), out])

    def close(self) -> None:
        """Stop accepting and close every channel (their sessions are closed by their threads)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class TcpChannelClient:
    """The worker's end over TCP, for a shard's range of ``count`` elements: ``params`` and ``grads`` (float32,
    1-D, contiguous; the worker's host buffers for that range). Same interface as
    :class:`~cmdare.ps.channel.ChannelClient`, so :func:`~cmdare.ps.channel.receive_all` takes either."""

    def __init__(self, address: TcpChannelAddress, params: np.ndarray, grads: np.ndarray,
                 timeout: float | None = None):
        for name, a in (("params", params), ("grads", grads)):
            if a.dtype != np.float32 or a.ndim != 1 or not a.flags.c_contiguous:
                raise ValueError(f"{name} must be a contiguous 1-D float32 array")
        if params.size != grads.size or params.size < 1 or not params.flags.writeable:
            raise ValueError("params (writeable) and grads must hold the same count of elements, at least 1")
        self.params, self.grads, self.count = params, grads, int(params.size)
        self._pieces: list[tuple[int, int]] = []  # this push's pieces so far, sorted
        self._sent = 0
        family, _, _, _, sockaddr = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)[0]
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _tune(self.sock)
            self.sock.settimeout(_HANDSHAKE_S if timeout is None else timeout)
            self.sock.connect(sockaddr)
            try:
                challenge = bytearray(_NONCE_BYTES)
                recv_into_exact(self.sock, challenge)
                hello = _HELLO.pack(0, 0, self.count)
                self.sock.sendall(hello + _mac(address.secret, bytes(challenge), hello))
                self._reply()  # the shard's ack
            except ConnectionError as err:  # ChannelClosed, or reset by a shard that refused
                raise ChannelRefused(f"the shard closed the channel during its handshake ({err})") from err
            self.sock.settimeout(None)
        except BaseException:
            self.sock.close()
            raise

    def send(self, pulled_step: int | None, sent_at: float | None, sender: int | None, sent: int = 0) -> None:
        """Push the gradient in ``grads`` (the reply brings the parameters); ``sent`` of its elements went as
        pieces, the rest go now."""
        if sent != self._sent:
            raise ValueError(f"a push counting {sent} elements sent as pieces; this channel sent {self._sent}")
        rest = [self.grads[lo:hi] for lo, hi in complement(self._pieces, self.count)]
        self._pieces, self._sent = [], 0
        self._request(_PUSH, pulled_step, sent_at, sender, sent, 0, rest)

    def send_piece(self, offset: int, count: int, pulled_step: int | None, sender: int | None) -> None:
        """Send elements ``[offset, offset + count)`` of ``grads``, final (no reply; the push answers)."""
        i = _slot(self._pieces, offset, offset + count, self.count)
        if i is None:
            raise ValueError(f"a piece of {count} elements at {offset}: outside [0, {self.count}) or overlapping")
        self._request(_PIECE, pulled_step, None, sender, count, offset, [self.grads[offset:offset + count]])
        self._pieces.insert(i, (offset, offset + count))
        self._sent += count

    def _request(self, kind: int, pulled_step: int | None, sent_at: float | None, sender: int | None,
                 count: int, offset: int, values: list[np.ndarray]) -> None:
        header = _REQUEST.pack(kind, -1 if pulled_step is None else pulled_step,
                               math.nan if sent_at is None else sent_at, -1 if sender is None else sender,
                               count, offset)
        try:
            _send_all(self.sock, [header, *values])
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err

    def receive(self) -> tuple[int, bool]:
        """Wait for the reply: (global step after the push, whether it was applied); the parameters land in
        ``params``."""
        reply = self._reply()
        try:
            recv_into_exact(self.sock, self.params)
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err
        return reply

    def _reply(self) -> tuple[int, bool]:
        header = bytearray(_REPLY.size)
        try:
            recv_into_exact(self.sock, header)
            status, step = _REPLY.unpack(header)
            if status == _FAILED:
                if not 0 <= step <= _MAX_MESSAGE:
                    raise ChannelClosed(f"a failure message of {step} bytes")
                message = bytearray(step)
                recv_into_exact(self.sock, message)
                raise RuntimeError(f"the shard failed a push: {message.decode('utf-8', 'replace')}")
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err
        if status not in (_APPLIED, _NOT_APPLIED):
            raise ChannelClosed(f"a reply of unknown status {status}")
        return step, status == _APPLIED

    def close(self) -> None:
        self.sock.close()
