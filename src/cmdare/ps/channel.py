"""The same-node data path between a worker and a shard: shared memory plus a Unix socket.

A worker on the same Ray node as a shard keeps its flat parameter and gradient buffers in one
anonymous shared-memory file (:class:`SharedHostMemory`, a ``memfd``) and hands the file to the shard
once, over a Unix socket (``SCM_RIGHTS``). Each step is then a 41-byte request on that socket: the
shard reads the gradient where backward left it, updates its own buffer and copies its parameters
straight into the worker's parameter memory, then answers 9 bytes. Pieces of the gradient may be
announced while backward still runs (:meth:`ChannelClient.send_piece`): the shard may update them at
once and write their parameters back, and the push that follows completes the step. No object is
created in Ray's object store and no Ray call is made per step; Ray's object store is left for what
crosses nodes.

The shard side is a :class:`Session` per channel (``connect(grad, out)`` makes it): the worker's
gradient and parameter memory for the shard's range, and the state of a push whose pieces are coming.

The socket lives in the abstract namespace (no file to clean up); a peer that dies closes it, which
the other side sees at once. Its name is visible to every local user (``/proc/net/unix``), so a channel is
authenticated before the shard maps anything: the peer must run as the shard's user (``SO_PEERCRED``) and
prove the channel's secret (an HMAC-SHA256 of a fresh challenge and its hello). The secret is made by the
shard and reaches workers only through Ray (:class:`ChannelAddress`; it never appears in a repr, a log or
a command line). A refused peer is logged and changes nothing. The name is free to take once the shard is
gone, so a worker hands its memory only to a listener of its own user.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = ["ChannelAddress", "ChannelClient", "ChannelClosed", "ChannelRefused", "ChannelServer", "Session",
           "SharedHostMemory", "channels_enabled", "receive_all"]

log = logging.getLogger(__name__)

_HELLO = struct.Struct("<qqq")  # gradient offset, parameter offset, element count (float32)
# kind, pulled step (-1: none), sent_at (nan: none), sender (-1: none), count (piece: its elements; push:
# the elements already sent as pieces), offset (piece: its first element in the shard's range)
_REQUEST = struct.Struct("<Bqdqqq")
_PUSH, _PIECE = 0, 1
_REPLY = struct.Struct("<Bq")  # status, global step after the push
_NONCE_BYTES = 32  # the shard's challenge; the hello carries HMAC-SHA256(secret, challenge + hello)
_MAC_BYTES = hashlib.sha256().digest_size
_HANDSHAKE_S = 10.0  # a peer that does not complete its hello in time is dropped (no thread held forever)
_APPLIED, _NOT_APPLIED, _FAILED = 0, 1, 2


class Session(Protocol):
    """The shard's side of one channel, over the worker's ``grad`` and ``out`` (parameter) memory."""

    def push(self, pulled_step: int | None, sent_at: float | None, sender: int | None,
             sent: int) -> tuple[int, bool]:
        """One push and pull: (global step after it, whether it was applied); ``sent`` of the gradient's
        elements came as pieces before."""

    def piece(self, offset: int, count: int, pulled_step: int | None, sender: int | None) -> tuple[int, int] | None:
        """Elements ``[offset, offset + count)`` of the next push's gradient are final. Returns the range whose
        updated parameters are now in ``out`` (an asynchronous shard applies a piece at once), or None."""

    def close(self) -> None:
        """The channel closed (the worker went away, possibly between a push's pieces)."""


#: ``connect(grad, out)``: a new channel's session.
Connect = Callable[[np.ndarray, np.ndarray], Session]


@dataclass(frozen=True)
class ChannelAddress:
    """Where a shard's channel listens and the secret a worker proves to use it (the secret never shows in
    a repr, so never in a log)."""

    name: str
    secret: bytes = field(repr=False)


class ChannelRefused(ConnectionError):
    """The shard refused the channel (wrong user or secret, or a malformed hello)."""


class ChannelClosed(ConnectionError):
    """The peer of a channel went away (its process or node died, or it closed the channel)."""


def channels_enabled() -> bool:
    """Whether this platform has the same-node path (Linux: memfd and fd passing); ``CMDARE_SHM=0`` turns
    it off, leaving every push and pull to Ray's calls and object store."""
    if os.environ.get("CMDARE_SHM", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


class SharedHostMemory:
    """A worker's host flat buffers: ``params`` and ``grads`` (``numel`` float32 each) in one memfd."""

    def __init__(self, numel: int):
        import torch

        self.numel = int(numel)
        self.fd = os.memfd_create("cmdare-flat", os.MFD_CLOEXEC)
        size = max(mmap.PAGESIZE, 2 * 4 * self.numel)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size)
        values = np.frombuffer(self._map, dtype=np.float32, count=2 * self.numel)
        self.params = torch.from_numpy(values[:self.numel])
        self.grads = torch.from_numpy(values[self.numel:])

    def close(self) -> None:
        """Close the file descriptor (the mapping lives while the buffers are referenced)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ChannelClosed("the channel's peer closed it")
        buf += chunk
    return bytes(buf)


class ChannelClient:
    """The worker's end of one channel: shard range ``[start, start + count)`` of ``memory``."""

    def __init__(self, address: ChannelAddress, memory: SharedHostMemory, start: int, count: int):
        self.count = count
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect("\0" + address.name)
            pid, uid = _peer(self.sock)
            if uid != os.geteuid():  # another user took the name of a shard that is gone
                raise ChannelRefused(f"the channel's listener (pid {pid}) runs as uid {uid}, not as this run's user")
            challenge = _recv_exact(self.sock, _NONCE_BYTES)
            hello = _HELLO.pack(memory.numel + start, start, count)
            socket.send_fds(self.sock, [hello + _mac(address.secret, challenge, hello)], [memory.fd])
            self._reply()  # the shard mapped the memory
        except ChannelClosed as err:
            self.sock.close()
            raise ChannelRefused(f"the shard closed the channel during its handshake ({err})") from err
        except BaseException:
            self.sock.close()
            raise

    def send(self, pulled_step: int | None, sent_at: float | None, sender: int | None, sent: int = 0) -> None:
        """Push the gradient now in the shared buffer (the reply brings the parameters); ``sent`` of its
        elements were announced as pieces."""
        self._request(_PUSH, pulled_step, sent_at, sender, sent, 0)

    def send_piece(self, offset: int, count: int, pulled_step: int | None, sender: int | None) -> None:
        """Announce elements ``[offset, offset + count)`` of the shard's gradient range as final (no reply;
        the push that follows is answered, and by then the piece's parameters may already be in place)."""
        self._request(_PIECE, pulled_step, None, sender, count, offset)

    def _request(self, kind: int, pulled_step: int | None, sent_at: float | None, sender: int | None,
                 count: int, offset: int) -> None:
        try:
            self.sock.sendall(_REQUEST.pack(kind, -1 if pulled_step is None else pulled_step,
                                            math.nan if sent_at is None else sent_at,
                                            -1 if sender is None else sender, count, offset))
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err

    def receive(self) -> tuple[int, bool]:
        """Wait for the reply: (global step after the push, whether it was applied)."""
        return self._reply()

    def _reply(self) -> tuple[int, bool]:
        try:
            status, step = _REPLY.unpack(_recv_exact(self.sock, _REPLY.size))
        except OSError as err:
            raise ChannelClosed(f"the shard's channel is gone: {err}") from err
        if status == _FAILED:
            message = _recv_exact(self.sock, step).decode("utf-8", "replace")
            raise RuntimeError(f"the shard failed a push: {message}")
        return step, status == _APPLIED

    def close(self) -> None:
        self.sock.close()


def receive_all(clients: Mapping[int, ChannelClient], t_sent: float,
                wait_s: list[float] | None = None) -> dict[int, tuple[int, bool]]:
    """Replies of every client in ``clients`` (by key), in the order they come; adds each key's
    send-to-reply time to ``wait_s[key]`` when given."""
    replies: dict[int, tuple[int, bool]] = {}
    if len(clients) == 1:
        (k, client), = clients.items()
        replies[k] = client.receive()
        if wait_s is not None:
            wait_s[k] += time.perf_counter() - t_sent
        return replies
    pending = {c.sock.fileno(): (k, c) for k, c in clients.items()}
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        now = time.perf_counter()
        for fd in ready:
            k, client = pending.pop(fd)
            replies[k] = client.receive()
            if wait_s is not None:
                wait_s[k] += now - t_sent
    return replies


def _mac(secret: bytes, challenge: bytes, hello: bytes) -> bytes:
    return hmac.new(secret, challenge + hello, hashlib.sha256).digest()


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


class ChannelServer:
    """The shard's end: accepts channels from workers that prove :attr:`address`'s secret and serves each on a
    thread of its own, through the :class:`Session` that ``connect`` makes for it."""

    def __init__(self, connect: Connect):
        self._connect = connect
        self.address = ChannelAddress(f"cmdare-shard-{uuid.uuid4().hex}", os.urandom(32))
        self.refused = 0  # channels refused (wrong user or secret, malformed hello)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address.name)
        self._listener.listen(64)
        self._closed = False
        threading.Thread(target=self._accept, name="cmdare-channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), name="cmdare-channel", daemon=True).start()

    def _refuse(self, pid: int, uid: int, why: str) -> None:
        self.refused += 1
        log.warning("shard channel %s refused a peer (pid %d, uid %d): %s", self.address.name, pid, uid, why)

    def _handshake(self, conn: socket.socket) -> tuple[np.ndarray, np.ndarray] | None:
        """The peer's gradient and parameter memory, once it proved it may use the channel (None: refused)."""
        pid, uid = _peer(conn)
        if uid != os.geteuid():
            self._refuse(pid, uid, f"not this run's user (uid {os.geteuid()})")
            return None
        challenge = os.urandom(_NONCE_BYTES)
        conn.settimeout(_HANDSHAKE_S)
        conn.sendall(challenge)
        message, fds, _, _ = socket.recv_fds(conn, _HELLO.size + _MAC_BYTES, 1)
        try:
            hello, mac = message[:_HELLO.size], message[_HELLO.size:]
            if len(fds) != 1 or len(message) != _HELLO.size + _MAC_BYTES:
                self._refuse(pid, uid, "malformed hello")
                return None
            if not hmac.compare_digest(mac, _mac(self.address.secret, challenge, hello)):
                self._refuse(pid, uid, "it did not prove the channel's secret")
                return None
            memory = mmap.mmap(fds[0], 0)
        finally:
            for fd in fds:
                os.close(fd)
        conn.settimeout(None)
        grad_at, params_at, count = _HELLO.unpack(hello)
        values = np.frombuffer(memory, dtype=np.float32)
        if count <= 0 or min(grad_at, params_at) < 0 or max(grad_at, params_at) + count > values.size:
            self._refuse(pid, uid, f"a hello outside its memory ({count} values at {grad_at} and {params_at} of "
                                   f"{values.size})")
            return None
        return values[grad_at:grad_at + count], values[params_at:params_at + count]

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                memory = self._handshake(conn)
                if memory is None:
                    return
                session = self._connect(*memory)
            except (ChannelClosed, OSError, ValueError):
                return
            try:
                conn.sendall(_REPLY.pack(_APPLIED, 0))
                self._serve(conn, session)
            except (ChannelClosed, OSError):
                return
            finally:
                session.close()

    @staticmethod
    def _serve(conn: socket.socket, session: Session) -> None:
        failed: Exception | None = None  # a piece that failed is reported with the push
        while True:
            kind, pulled, sent_at, sender, count, offset = _REQUEST.unpack(_recv_exact(conn, _REQUEST.size))
            pulled_step, who = None if pulled < 0 else pulled, None if sender < 0 else sender
            try:
                if kind == _PIECE:
                    if failed is None:
                        session.piece(offset, count, pulled_step, who)
                    continue
                if failed is not None:
                    raise failed
                step, applied = session.push(pulled_step, None if math.isnan(sent_at) else sent_at, who, count)
            except Exception as err:  # noqa: BLE001 - the worker raises it
                if kind == _PIECE:
                    failed = err
                    continue
                failed = None
                message = f"{type(err).__name__}: {err}".encode()
                conn.sendall(_REPLY.pack(_FAILED, len(message)) + message)
                continue
            conn.sendall(_REPLY.pack(_APPLIED if applied else _NOT_APPLIED, step))

    def close(self) -> None:
        """Stop accepting channels (open ones end when their workers close them or exit)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

