"""A worker's session with a shard over a same-node channel: the worker's gradient and parameter
memory for the shard's range, and the push whose pieces are arriving; and the staged gradient of a
worker that sends pieces through Ray.

An asynchronous shard applies each channel piece on arrival (:class:`~cmdare.ps.shard_state.OpenPush`)
unless someone waits for whole steps or the layout is stale; a synchronous shard only carries it over
its link, its round needing every worker. Pieces through Ray are staged until the rest of the push
comes, then applied whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cmdare.ps.shard_state import OpenPush

__all__ = ["AsyncSession", "StagedGradient", "SyncSession", "scatter_ranges"]


def scatter_ranges(target: np.ndarray, ranges: Sequence[tuple[int, int]], values: np.ndarray) -> int:
    """Copy ``values`` (the ranges' elements one after the other) into ``target``; returns their number."""
    pos = 0
    for lo, hi in ranges:
        target[lo:hi] = values[pos:pos + hi - lo]
        pos += hi - lo
    if pos != values.size:
        raise ValueError(f"{values.size} values for ranges of {pos} elements")
    return pos


@dataclass
class StagedGradient:
    """A shard's copy of a Ray-path worker's gradient, and the pieces of its push so far (``arrived``: a
    synchronous shard's condition, notified per piece)."""

    grad: np.ndarray
    arrived: asyncio.Condition | None = None
    pieces: tuple[int | None, int] = (None, 0)  # (pulled step of the push, pieces received)

    def count(self, pulled_step: int | None) -> None:
        """One more piece of the push on parameters of ``pulled_step`` (a newer push starts again at 1)."""
        seen = self.pieces[1] if self.pieces[0] == pulled_step else 0
        self.pieces = (pulled_step, seen + 1)


class AsyncSession:
    """A worker's session with an asynchronous shard (``actor``: its ``state``, ``_lock``, ``_gate``, ``_idle``)."""

    def __init__(self, actor: Any, grad: np.ndarray, out: np.ndarray):
        self.actor, self.grad, self.out = actor, grad, out
        self.open: OpenPush | None = None

    def piece(self, offset: int, count: int, pulled_step: int | None, sender: int | None) -> tuple[int, int] | None:
        a, state = self.actor, self.actor.state
        with a._lock:  # the link carries one transfer at a time
            state.piece(4 * count)
            if self.open is None and a._gate == 0 and self.grad.size == state.params.size:
                self.open = state.open_push(self.grad, pulled_step)
            if self.open is None:
                return None
            updated = state.apply_piece(self.open, self.grad, self.out, offset, offset + count)
            if not updated:
                return None
            state.transfer(4 * updated)  # the piece's parameters go back now
            self.open.returned += 4 * updated
            return self.open.applied[-1]

    def push(self, pulled_step: int | None, sent_at: float | None, sender: int | None,
             sent: int) -> tuple[int, bool]:
        a = self.actor
        with a._lock:
            push, self.open = self.open, None
            try:
                applied = a.state.serve(self.grad, pulled_step, sent_at, self.out, 4 * sent, push)
            finally:
                if push is not None:
                    a._idle.notify_all()
            return a.state.step, applied

    def close(self) -> None:
        a = self.actor
        with a._lock:
            if self.open is not None:
                a.state.abandon_push(self.open)
                self.open = None
                a._idle.notify_all()


class SyncSession:
    """A channel of a synchronous shard: its pushes and pieces are handed to the actor's event loop."""

    def __init__(self, actor: Any, grad: np.ndarray, out: np.ndarray):
        self.actor, self.grad, self.out = actor, grad, out

    def push(self, pulled_step: int | None, sent_at: float | None, sender: int | None,
             sent: int) -> tuple[int, bool]:
        a = self.actor
        assert a._loop is not None
        _, step, applied = asyncio.run_coroutine_threadsafe(a._push(self.grad, sent_at, sender, self.out, 4 * sent),
                                                            a._loop).result()
        return step, applied

    def piece(self, offset: int, count: int, pulled_step: int | None, sender: int | None) -> None:
        assert self.actor._loop is not None  # a synchronous round updates nothing before every worker pushed
        asyncio.run_coroutine_threadsafe(self.actor._announced(4 * count), self.actor._loop).result()

    def close(self) -> None:
        pass
