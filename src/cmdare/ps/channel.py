"""The same-node data path between a worker and a shard: shared memory plus a Unix socket.

A worker on the same Ray node as a shard keeps its flat parameter and gradient buffers in one
anonymous shared-memory file (:class:`SharedHostMemory`, a ``memfd``) and hands the file to the shard
once, over a Unix socket (``SCM_RIGHTS``). Each step is then a 33-byte request on that socket: the
shard reads the gradient where backward left it, updates its own buffer and copies its parameters
straight into the worker's parameter memory, then answers 9 bytes. With an emulated link, pieces of
the gradient may be announced while backward still runs (:meth:`ChannelClient.send_piece`): the shard
spends their link time then, and the push that follows carries only the rest. No object is created in Ray's object
store and no Ray call is made per step; Ray's object store is left for what crosses nodes.

The socket lives in the abstract namespace (no file to clean up); a peer that dies closes it, which
the other side sees at once.
"""

from __future__ import annotations

import contextlib
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

import numpy as np

__all__ = ["ChannelClient", "ChannelClosed", "ChannelServer", "SharedHostMemory", "channels_enabled",
           "receive_all"]

_HELLO = struct.Struct("<qqq")  # gradient offset, parameter offset, element count (float32)
# kind, pulled step (-1: none), sent_at (nan: none), sender (-1: none), bytes (piece: its size; push: the
# bytes already sent as pieces)
_REQUEST = struct.Struct("<Bqdqq")
_PUSH, _PIECE = 0, 1
_REPLY = struct.Struct("<Bq")  # status, global step after the push
_APPLIED, _NOT_APPLIED, _FAILED = 0, 1, 2

#: ``serve(grad, out, pulled_step, sent_at, sender, sent_bytes) -> (step, applied)``: one push and pull of a
#: shard, ``sent_bytes`` of the gradient having come as pieces before.
Serve = Callable[[np.ndarray, np.ndarray, "int | None", "float | None", "int | None", int], tuple[int, bool]]
#: ``piece(nbytes, sender)``: a piece of the next push's gradient (its link time; the data is shared).
Piece = Callable[[int, "int | None"], None]


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

    def __init__(self, address: str, memory: SharedHostMemory, start: int, count: int):
        self.count = count
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect("\0" + address)
            socket.send_fds(self.sock, [_HELLO.pack(memory.numel + start, start, count)], [memory.fd])
            self._reply()  # the shard mapped the memory
        except BaseException:
            self.sock.close()
            raise

    def send(self, pulled_step: int | None, sent_at: float | None, sender: int | None, sent_bytes: int = 0) -> None:
        """Push the gradient now in the shared buffer (the reply brings the parameters); ``sent_bytes`` of it
        were announced as pieces."""
        self._request(_PUSH, pulled_step, sent_at, sender, sent_bytes)

    def send_piece(self, nbytes: int, sender: int | None) -> None:
        """Announce ``nbytes`` of the gradient as ready (no reply; the push that follows is answered)."""
        self._request(_PIECE, None, None, sender, nbytes)

    def _request(self, kind: int, pulled_step: int | None, sent_at: float | None, sender: int | None,
                 nbytes: int) -> None:
        try:
            self.sock.sendall(_REQUEST.pack(kind, -1 if pulled_step is None else pulled_step,
                                            math.nan if sent_at is None else sent_at,
                                            -1 if sender is None else sender, nbytes))
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


class ChannelServer:
    """The shard's end: accepts channels and serves each on a thread of its own with ``serve`` (pushes) and
    ``piece`` (pieces announced ahead of a push)."""

    def __init__(self, serve: Serve, piece: Piece):
        self._serve, self._piece = serve, piece
        self.address = f"cmdare-shard-{uuid.uuid4().hex}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address)
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

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                hello, fds, _, _ = socket.recv_fds(conn, _HELLO.size, 1)
                if len(hello) != _HELLO.size or len(fds) != 1:
                    return
                grad_at, params_at, count = _HELLO.unpack(hello)
                try:
                    memory = mmap.mmap(fds[0], 0)
                finally:
                    os.close(fds[0])
                values = np.frombuffer(memory, dtype=np.float32)
                grad, out = values[grad_at:grad_at + count], values[params_at:params_at + count]
                conn.sendall(_REPLY.pack(_APPLIED, 0))
                failed: Exception | None = None  # a piece that failed is reported with the push
                while True:
                    kind, pulled, sent_at, sender, nbytes = _REQUEST.unpack(_recv_exact(conn, _REQUEST.size))
                    try:
                        if kind == _PIECE:
                            self._piece(nbytes, None if sender < 0 else sender)
                            continue
                        if failed is not None:
                            raise failed
                        step, applied = self._serve(grad, out, None if pulled < 0 else pulled,
                                                    None if math.isnan(sent_at) else sent_at,
                                                    None if sender < 0 else sender, nbytes)
                    except Exception as err:  # noqa: BLE001 - the worker raises it
                        if kind == _PIECE:
                            failed = err
                            continue
                        failed = None
                        message = f"{type(err).__name__}: {err}".encode()
                        conn.sendall(_REPLY.pack(_FAILED, len(message)) + message)
                        continue
                    conn.sendall(_REPLY.pack(_APPLIED if applied else _NOT_APPLIED, step))
            except (ChannelClosed, OSError):
                return

    def close(self) -> None:
        """Stop accepting channels (open ones end when their workers close them or exit)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

