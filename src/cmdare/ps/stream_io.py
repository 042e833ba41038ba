"""Whole buffers over a stream socket: the TCP channel's sending and receiving, without copies.

Buffers are sent from and received into numpy arrays and bytearrays (``sendmsg`` / ``recv_into``);
:class:`FrameWriter` sends a connection's frames from a thread of its own, in order.
"""

from __future__ import annotations

import bisect
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Sequence

from cmdare.ps.channel import ChannelClosed

__all__ = ["ALIGN", "FrameWriter", "padded", "recv_into_exact", "recv_padded", "send_all", "slot", "tune"]

# SO_SNDBUF / SO_RCVBUF, or None: Linux's autotuning, which grows each buffer to what the path needs (up to
# net.ipv4.tcp_{w,r}mem's maximum). Measured on loopback, 2 cores, 10 MB each way: fixed 4 MiB buffers 1.2x
# slower than autotuning; fixed 256 KiB-1 MiB 0-15% faster there (the bytes in flight stay in cache), but such a
# buffer caps a real link at its size per round trip (1 MiB at 0.5 ms: 2 GB/s), so autotuning it is.
_BUFFER_BYTES: int | None = None
_WAITALL = getattr(socket, "MSG_WAITALL", 0)  # one recv, one wake-up, for a whole gradient or reply
_IOV_MAX = 512  # buffers per sendmsg
# Every header and payload starts on a multiple of ALIGN bytes of its stream: the kernel's copies between a
# socket and a buffer run several times slower when the two are misaligned (measured on loopback, 10 MB each
# way: 9.4 ms with 41- and 25-byte headers before the values, 5.4 ms with 64-byte ones; 4-byte alignment alone
# gained nothing).
ALIGN = 64
_ZEROS = bytes(ALIGN)


def tune(sock: socket.socket) -> None:
    """No delay for small frames; the buffer sizes left to Linux (:data:`_BUFFER_BYTES`)."""
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


def padded(payloads: Sequence) -> list:
    """``payloads`` each followed by the zero bytes that end it on a multiple of :data:`ALIGN`."""
    out = []
    for p in payloads:
        out.append(p)
        pad = -memoryview(p).nbytes % ALIGN
        if pad:
            out.append(_ZEROS[:pad])
    return out


def recv_padded(sock: socket.socket, view) -> None:
    """Fill ``view`` from ``sock``, then take the padding :func:`padded` put after it."""
    recv_into_exact(sock, view)
    pad = -memoryview(view).nbytes % ALIGN
    if pad:
        recv_into_exact(sock, bytearray(pad))


def send_all(sock: socket.socket, buffers: Sequence) -> None:
    """Send every buffer, in order, with as few system calls as the socket allows."""
    views = [v for v in (memoryview(b).cast("B") for b in buffers) if len(v)]
    while views:
        n = sock.sendmsg(views[:_IOV_MAX])
        while n:
            if n >= len(views[0]):
                n -= len(views.pop(0))
            else:
                views[0], n = views[0][n:], 0


class FrameWriter:
    """A connection's sending side: a thread that sends each queued frame in order, so that whoever reads the
    connection never waits for a peer to take what it was sent (the peer may be sending too). The buffers of a
    queued frame must stay unchanged until it is sent. A send that fails shuts the connection down (its reader
    sees it go) and drops the frames after it. :meth:`send_now` sends from the caller's thread once the queue
    is sent: no hand-over to the thread when the peer is known to be reading."""

    def __init__(self, conn: socket.socket):
        self._conn = conn
        self._frames: queue.SimpleQueue[list | None] = queue.SimpleQueue()
        self._pending = 0  # frames queued and not yet sent
        self._sent = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="cmdare-tcp-channel-send", daemon=True)
        self._thread.start()

    def send(self, buffers: list) -> None:
        """Queue one frame: its header and the buffers that follow it."""
        with self._sent:
            self._pending += 1
        self._frames.put(buffers)

    def send_now(self, buffers: list) -> None:
        """Send one frame from this thread, after every queued one (:class:`OSError` if the connection is gone)."""
        with self._sent:
            while self._pending:
                self._sent.wait()
        send_all(self._conn, buffers)

    def stop(self) -> None:
        """End the thread once the queued frames are sent (or their connection is gone)."""
        self._frames.put(None)
        self._thread.join()

    def _run(self) -> None:
        failed = False
        while (frame := self._frames.get()) is not None:
            if not failed:
                try:
                    send_all(self._conn, frame)
                except OSError:
                    failed = True
                    with contextlib.suppress(OSError):
                        self._conn.shutdown(socket.SHUT_RDWR)
            with self._sent:
                self._pending -= 1
                self._sent.notify_all()


def slot(ranges: list[tuple[int, int]], lo: int, hi: int, n: int) -> int | None:
    """Where ``[lo, hi)`` goes in the sorted disjoint ``ranges`` (None: outside ``[0, n)``, empty, or overlapping)."""
    if lo < 0 or hi <= lo or hi > n:
        return None
    i = bisect.bisect_left(ranges, (lo, hi))
    if (i > 0 and ranges[i - 1][1] > lo) or (i < len(ranges) and ranges[i][0] < hi):
        return None
    return i
