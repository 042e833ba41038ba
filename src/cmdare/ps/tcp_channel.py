"""The cross-node data path between a worker and a shard: channel.py's protocol over TCP.

One protocol, two carriers: :mod:`cmdare.ps.channel` carries it within a node (a Unix socket; the gradient
and parameters stay in shared memory); this module carries the same frames between nodes, each followed by
the values it names, sent from and received into numpy buffers (``sendmsg`` / ``recv_into``, no copy).

Every header and payload starts on a multiple of 64 bytes of its stream (:data:`~cmdare.ps.stream_io.ALIGN`:
headers are padded to 64 bytes, payloads end with zeros up to the next multiple): the kernel copies aligned bytes
much faster. Handshake, both ways: the shard's 32-byte challenge; the worker's ``_HELLO`` (0, 0, element count),
HMAC-SHA256(secret, challenge + hello) and a 32-byte nonce of its own (128 bytes, padded); the shard allocates the
connection's own ``grad`` and ``out``, makes its :class:`~cmdare.ps.channel.Session` and acks with its proof,
HMAC-SHA256(secret, "shard" + challenge + nonce), without which the worker sends nothing (whatever holds the port
of a shard that went away is not the shard). A PIECE request is followed by its ``count`` gradient elements; a PUSH
(``count``: elements already sent as pieces) by the ranges its pieces left, ascending (each padded). Requests are
channel.py's ``_REQUEST`` fields in a 64-byte ``_UP`` header.

The shard answers with ``_DOWN`` frames (status, step, offset, count). Since the worker's memory is not
shared, a piece the session updates at once has its parameters streamed back at once: a PARAMS frame
followed by those ``count`` elements at ``offset``, sent by the connection's writer thread while the reader
takes the next piece. The push's reply (APPLIED or NOT_APPLIED, the global step) is followed by the
parameters no PARAMS frame of this push brought, ascending; FAILED by a message of ``step`` bytes.

The shard binds its node's address only and serves only peers that prove the secret, which reaches workers
through Ray (:class:`TcpChannelAddress` never shows it). A peer that breaks the protocol (a frame outside its
range, overlapping pieces, a miscounted push, a truncated frame) loses its own connection; nothing is
allocated from a length a peer claims. The handshake authenticates both ends, not the bytes that follow: the
cluster network is trusted not to rewrite packets.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import math
import os
import socket
import struct
import threading
import time
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
    ChannelClosed,
    ChannelRefused,
    Connect,
    Session,
    _mac,
)
from cmdare.ps.shard_state import complement
from cmdare.ps.stream_io import ALIGN, FrameWriter, padded, recv_into_exact, recv_padded, send_all, slot, tune

__all__ = ["TcpChannelAddress", "TcpChannelClient", "TcpChannelServer", "recv_into_exact", "tcp_channels_enabled"]


def tcp_channels_enabled() -> bool:
    """Whether workers reach a shard on another node over its TCP channel; ``CMDARE_TCP=0`` turns it off,
    leaving every push and pull to another node to Ray's calls and object store."""
    return os.environ.get("CMDARE_TCP", "1").strip().lower() not in ("0", "false", "no", "off")


log = logging.getLogger(__name__)

_MAX_COUNT = 2**31  # elements a hello may ask for (8 GiB of float32 per buffer)
_MAX_MESSAGE = 1 << 16  # bytes of a FAILED reply's message
# the shard's frames: status, global step (FAILED: the message's length), offset and count (PARAMS: the
# parameters that follow; else 0, 0)
_DOWN = struct.Struct(f"<Bqqq{ALIGN - 25}x")
# the worker's requests: channel.py's request (kind, pulled step, sent_at, sender, count, offset), padded
_UP = struct.Struct(f"<Bqdqqq{ALIGN - 41}x")
_HELLO_BYTES = 2 * ALIGN  # the hello, its proof and the worker's nonce, padded
_PARAMS = 3  # a status of _DOWN beside channel.py's APPLIED, NOT_APPLIED and FAILED


def _shard_proof(secret: bytes, challenge: bytes, nonce: bytes) -> bytes:
    """The shard's answer to a worker's ``nonce``: the worker sends nothing more to a peer that cannot give it."""
    return _mac(secret, b"shard" + challenge, nonce)


@dataclass(frozen=True)
class TcpChannelAddress:
    """Where a shard's TCP channel listens and the secret a worker proves to use it (never in a repr)."""

    host: str
    port: int
    secret: bytes = field(repr=False)


class _Dropped(Exception):
    """A peer broke the protocol: its connection is closed."""


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
            tune(self._listener)  # accepted connections inherit the buffer sizes (and so the TCP window)
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
                tune(conn)
                proven = self._handshake(conn, peer)
                if proven is None:
                    return
                count, proof = proven
                grad, out = np.zeros(count, np.float32), np.zeros(count, np.float32)
                session = self._connect(grad, out)
                conn.sendall(_DOWN.pack(_APPLIED, 0, 0, 0) + proof)
                writer = FrameWriter(conn)
                try:
                    self._serve(conn, session, grad, out, writer)
                finally:
                    with contextlib.suppress(OSError):  # a writer blocked on a peer that stopped reading
                        conn.shutdown(socket.SHUT_RDWR)
                    writer.stop()
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

    def _handshake(self, conn: socket.socket, peer: str) -> tuple[int, bytes] | None:
        """The element count of a peer that proved the secret with a sound hello, and the shard's own proof
        for it (None: refused)."""
        challenge = os.urandom(_NONCE_BYTES)
        message = bytearray(_HELLO_BYTES)
        try:
            conn.settimeout(_HANDSHAKE_S)
            conn.sendall(challenge)
            recv_into_exact(conn, message, deadline=time.monotonic() + _HANDSHAKE_S)
        except TimeoutError:
            why = f"no hello within {_HANDSHAKE_S:g} s"
        except OSError:
            why = "it closed before its hello"
        else:
            hello, mac = bytes(message[:_HELLO.size]), bytes(message[_HELLO.size:_HELLO.size + _MAC_BYTES])
            if not hmac.compare_digest(mac, _mac(self.address.secret, challenge, hello)):
                why = "it did not prove the channel's secret"
            else:
                count = _HELLO.unpack(hello)[2]
                if 1 <= count <= _MAX_COUNT:
                    conn.settimeout(None)
                    nonce = bytes(message[_HELLO.size + _MAC_BYTES:_HELLO.size + _MAC_BYTES + _NONCE_BYTES])
                    return count, _shard_proof(self.address.secret, challenge, nonce)
                why = f"a hello of {count} elements (1 to {_MAX_COUNT})"
        with self._lock:
            self.refused += 1
        log.warning("refused a channel from %s: %s", peer, why)
        return None

    @staticmethod
    def _serve(conn: socket.socket, session: Session, grad: np.ndarray, out: np.ndarray, writer: FrameWriter) -> None:
        n = grad.size
        header = bytearray(_UP.size)
        ranges: list[tuple[int, int]] = []  # this push's pieces so far, sorted
        returned: list[tuple[int, int]] = []  # the parameters already streamed back in this push, sorted
        sent = 0
        failed: Exception | None = None  # a piece that failed is reported with the push
        while True:
            recv_into_exact(conn, header)
            kind, pulled, sent_at, sender, count, offset = _UP.unpack(header)
            pulled_step, who = None if pulled < 0 else pulled, None if sender < 0 else sender
            if kind == _PIECE:
                i = slot(ranges, offset, offset + count, n)
                if i is None:
                    raise _Dropped(f"a piece of {count} elements at {offset}: outside [0, {n}) or overlapping "
                                   f"{len(ranges)} earlier pieces")
                recv_padded(conn, grad[offset:offset + count])
                ranges.insert(i, (offset, offset + count))
                sent += count
                if failed is None:
                    try:
                        final = session.piece(offset, count, pulled_step, who)
                    except Exception as err:  # noqa: BLE001 - the worker raises it with the push
                        failed = err
                    else:
                        if final is not None and (j := slot(returned, *final, n)) is not None:
                            returned.insert(j, final)
                            lo, hi = final
                            writer.send([_DOWN.pack(_PARAMS, 0, lo, hi - lo), *padded([out[lo:hi]])])
                continue
            if kind != _PUSH:
                raise _Dropped(f"a request of unknown kind {kind}")
            if count != sent:
                raise _Dropped(f"a push counting {count} elements sent as pieces, not {sent}")
            for lo, hi in complement(ranges, n):
                recv_padded(conn, grad[lo:hi])
            streamed, ranges, returned, sent = returned, [], [], 0
            try:
                if failed is not None:
                    raise failed
                step, applied = session.push(pulled_step, None if math.isnan(sent_at) else sent_at, who, count)
            except Exception as err:  # noqa: BLE001 - the worker raises it
                failed = None
                message = f"{type(err).__name__}: {err}".encode()[:_MAX_MESSAGE]
                writer.send_now([_DOWN.pack(_FAILED, len(message), 0, 0), *padded([message])])
                continue
            # the worker has sent its whole push and reads: the reply goes from this thread, after the pieces'
            rest = [out[lo:hi] for lo, hi in complement(streamed, n)]
            writer.send_now([_DOWN.pack(_APPLIED if applied else _NOT_APPLIED, step, 0, 0), *padded(rest)])

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
            tune(self.sock)
            self.sock.settimeout(_HANDSHAKE_S if timeout is None else timeout)
            self.sock.connect(sockaddr)
            try:
                challenge, nonce = bytearray(_NONCE_BYTES), os.urandom(_NONCE_BYTES)
                recv_into_exact(self.sock, challenge)
                hello = _HELLO.pack(0, 0, self.count)
                message = hello + _mac(address.secret, bytes(challenge), hello) + nonce
                self.sock.sendall(message.ljust(_HELLO_BYTES, b"\0"))
                self._reply()  # the shard's ack
                proof = bytearray(_MAC_BYTES)
                recv_into_exact(self.sock, proof)
            except ConnectionError as err:  # ChannelClosed, or reset by a shard that refused
                raise ChannelRefused(f"the shard closed the channel during its handshake ({err})") from err
            except TimeoutError as err:
                raise ChannelRefused(f"the peer at {address.host}:{address.port} did not complete the handshake "
                                     f"in time") from err
            if not hmac.compare_digest(bytes(proof), _shard_proof(address.secret, bytes(challenge), nonce)):
                raise ChannelRefused(f"the peer at {address.host}:{address.port} did not prove the shard's secret: "
                                     f"not the shard (it may have gone, and something else took its port)")
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
        i = slot(self._pieces, offset, offset + count, self.count)
        if i is None:
            raise ValueError(f"a piece of {count} elements at {offset}: outside [0, {self.count}) or overlapping")
        self._request(_PIECE, pulled_step, None, sender, count, offset, [self.grads[offset:offset + count]])
        self._pieces.insert(i, (offset, offset + count))
        self._sent += count

    def _request(self, kind: int, pulled_step: int | None, sent_at: float | None, sender: int | None,
                 count: int, offset: int, values: list[np.ndarray]) -> None:
        header = _UP.pack(kind, -1 if pulled_step is None else pulled_step,
                          math.nan if sent_at is None else sent_at, -1 if sender is None else sender, count, offset)
        try:
            send_all(self.sock, [header, *padded(values)])
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err

    def receive(self) -> tuple[int, bool]:
        """Wait for the reply: (global step after the push, whether it was applied); the parameters land in
        ``params`` (those of pieces the shard applied at once come first, the rest with the reply)."""
        returned: list[tuple[int, int]] = []
        try:
            while True:
                status, step, offset, count = self._frame()
                if status != _PARAMS:
                    break
                i = slot(returned, offset, offset + count, self.count)
                if i is None:
                    raise ChannelClosed(f"parameters of {count} elements at {offset}: outside [0, {self.count}) "
                                        f"or overlapping")
                recv_padded(self.sock, self.params[offset:offset + count])
                returned.insert(i, (offset, offset + count))
            for lo, hi in complement(returned, self.count):
                recv_padded(self.sock, self.params[lo:hi])
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err
        return step, status == _APPLIED

    def _reply(self) -> tuple[int, bool]:
        """The handshake's ack."""
        try:
            status, step, _, _ = self._frame()
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err
        if status == _PARAMS:
            raise ChannelClosed("parameters before the handshake's ack")
        return step, status == _APPLIED

    def _frame(self) -> tuple[int, int, int, int]:
        """The shard's next frame header (a FAILED one is raised with its message)."""
        header = bytearray(_DOWN.size)
        recv_into_exact(self.sock, header)
        status, step, offset, count = _DOWN.unpack(header)
        if status == _FAILED:
            if not 0 <= step <= _MAX_MESSAGE:
                raise ChannelClosed(f"a failure message of {step} bytes")
            message = bytearray(step)
            recv_padded(self.sock, message)
            raise RuntimeError(f"the shard failed a push: {message.decode('utf-8', 'replace')}")
        if status not in (_APPLIED, _NOT_APPLIED, _PARAMS):
            raise ChannelClosed(f"a reply of unknown status {status}")
        return status, step, offset, count

    def close(self) -> None:
        self.sock.close()
