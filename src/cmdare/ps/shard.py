"""Parameter shards as Ray actors: :class:`AsyncShardActor` and :class:`SyncShardActor`.

A shard (:class:`~cmdare.ps.shard_state.ShardState`) holds its blocks in one flat float32 buffer
with the momentum beside it and applies the optimizer there. :class:`AsyncShardActor` applies every
push at once (asynchronous training: the global step counts applied pushes); :class:`SyncShardActor`
averages one gradient per worker, applies it once, and answers every waiting worker (synchronous).

A push is answered with the shard's parameters in the same exchange (push + pull is one round trip),
over one of two paths: a worker on the shard's Ray node uses the shard's channel
(:mod:`cmdare.ps.channel`: shared memory, no Ray call and no object per step); any other worker calls
``push_pull`` and the parameters travel as one array through Ray's object store (zero-copy on read).

On a channel, pieces of a gradient announced during backward are applied by an asynchronous shard as
they come, and their parameters written back at once (pulled in the order they were pushed): the step
is claimed at the first piece and completed by the push (:class:`~cmdare.ps.shard_state.OpenPush`).
Snapshots, loads and block moves wait until no push is half-applied. A synchronous shard only carries
the pieces over its link: its update needs every worker's gradient.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator

import numpy as np

from cmdare.ps.channel import ChannelAddress, ChannelServer, channels_enabled
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.ps.shard_sessions import AsyncSession, StagedGradient, SyncSession, scatter_ranges
from cmdare.ps.shard_state import BlockData, ShardState, ShardStats
from cmdare.ps.tcp_channel import TcpChannelAddress, TcpChannelServer, tcp_channels_enabled

log = logging.getLogger(__name__)

#: Longest wait of a snapshot or block move for pushes whose pieces are being applied (a worker finishes
#: its backward within a step; one that hangs between pieces and push is not waited for longer).
OPEN_PUSH_WAIT_S = 30.0

__all__ = ["AsyncShardActor", "BlockData", "ShardState", "ShardStats", "SyncShardActor"]


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


class _ShardActorBase:
    """Methods shared by both actor forms (control plane: load, move, snapshot, stats).

    Channel pushes are served on threads of their own, so every method holds ``_lock`` while it
    touches the state, and arrays handed to Ray are copies while a channel may update in place.
    """

    state: ShardState
    _channel: ChannelServer | None = None
    _tcp: TcpChannelServer | None = None

    def _init_base(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when an open push completes or is abandoned
        self._gate = 0  # callers waiting for whole steps: no push opens early meanwhile
        self._staging: dict[int, StagedGradient] = {}  # per worker on another node: its gradient's pieces

    def _staging_for(self, worker: int, count: int) -> StagedGradient:
        """Worker ``worker``'s staged gradient (a new one for a new layout; ``count``: its view of the shard)."""
        self.state.check_size(count)
        staged = self._staging.get(worker)
        if staged is None or staged.grad.size != count:
            staged = self._staging[worker] = StagedGradient(np.zeros(count, np.float32), self._piece_signal())
        return staged

    def _piece_signal(self) -> asyncio.Condition | None:
        """What a staged gradient notifies per piece (a synchronous shard's push waits on it)."""
        return None

    @contextlib.contextmanager
    def _whole_steps(self) -> Iterator[None]:
        """Hold the lock at a point where every push is either applied in full or not at all."""
        with self._lock:
            self._gate += 1
            try:
                if not self._idle.wait_for(lambda: self.state.open_pushes == 0, timeout=OPEN_PUSH_WAIT_S):
                    log.warning("shard %d: %d push(es) still half-applied after %.0f s; going on",
                                self.state.shard_id, self.state.open_pushes, OPEN_PUSH_WAIT_S)
                yield
            finally:
                self._gate -= 1

    def _params_out(self) -> np.ndarray:
        """The parameters to return through Ray: the buffer itself, or a copy once channels serve pushes."""
        return self.state.params if self._channel is None and self._tcp is None else self.state.params.copy()

    def load(self, data: BlockData) -> int:
        with self._whole_steps():
            self.state.load(data)
            return self.state.step

    def pull(self) -> tuple[np.ndarray, int]:
        """The parameters and step; they cross the emulated link like a push's reply."""
        with self._lock:
            self.state.count_pull()
            params, step = self._params_out(), self.state.step
            self.state.transfer(params.nbytes)
            return params, step

    def snapshot(self) -> BlockData:
        with self._whole_steps():
            return self.state.snapshot()

    def take(self, block_ids: list[int]) -> BlockData:
        with self._whole_steps():
            return self.state.take(set(block_ids))

    def add(self, data: BlockData) -> int:
        with self._whole_steps():
            self.state.add(data)
            return self.state.step

    def stats(self, reset: bool = True) -> ShardStats:
        with self._lock:
            return self.state.stats(reset)

    def set_lr_scale(self, scale: float) -> None:
        self.state.lr_scale = float(scale)

    def set_staleness_damping(self, on: bool) -> None:
        self.state.staleness_damping = bool(on)

    def set_slowdown(self, factor: float) -> None:
        self.state.slowdown = max(1.0, float(factor))

    def set_link(self, bytes_per_s: float | None) -> None:
        self.state.link_bytes_per_s = float(bytes_per_s) if bytes_per_s else None

    def set_max_step(self, max_step: int | None) -> None:
        self.state.max_step = max_step

    def ping(self) -> int:
        return self.state.step

    def node_id(self) -> str:
        """The Ray node this shard runs on (hex), to watch for its drain."""
        return _node_id()

    def channel(self) -> tuple[str, ChannelAddress | None]:
        """(this shard's Ray node, its channel address and secret): workers on that node push through the
        channel; the address is None where channels are off (``CMDARE_SHM=0``, not Linux). Ray carries the
        secret to the worker that asks (with Ray's token authentication on, only the run's own processes can)."""
        if self._channel is None and channels_enabled():
            self._channel = ChannelServer(self._session)
        return _node_id(), self._channel.address if self._channel is not None else None

    def tcp_channel(self) -> TcpChannelAddress | None:
        """This shard's channel for workers on other nodes: the same protocol over TCP, listening on this node's
        Ray address (never a wildcard), with a secret of its own that Ray carries to the worker that asks; None
        where it is off (``CMDARE_TCP=0``)."""
        if self._tcp is None and tcp_channels_enabled():
            import ray

            self._tcp = TcpChannelServer(self._session, ray.util.get_node_ip_address())
        return self._tcp.address if self._tcp is not None else None

    def _session(self, grad: np.ndarray, out: np.ndarray):
        raise NotImplementedError


class AsyncShardActor(_ShardActorBase):
    """Asynchronous training: each push is applied on arrival, one at a time."""

    def __init__(self, shard_id: int, cfg: OptimizerConfig, max_step: int | None = None, optimizer: str = "sgd"):
        self._init_base()
        self.state = ShardState(shard_id, cfg, max_step, optimizer)

    def push_pull(self, grad: np.ndarray, pulled_step: int | None = None,
                  sent_at: float | None = None, sender: int | None = None) -> tuple[np.ndarray, int, bool]:
        """Apply ``grad``; return (parameters, global step after it, whether it was applied).
        ``sender`` (the worker's data slot) matters only to synchronous shards."""
        with self._lock:
            applied = self.state.serve(grad, pulled_step, sent_at)
            # Without channels returned without a copy: Ray serialises it before this actor runs the next call.
            return self._params_out(), self.state.step, applied

    def _session(self, grad: np.ndarray, out: np.ndarray) -> AsyncSession:
        return AsyncSession(self, grad, out)

    # -- the Ray path's pieces (a worker on another node) -----------------------------------
    # Staged, not applied on arrival: this actor runs one Ray call at a time, so a snapshot waiting for a
    # half-applied push would wait for the very ``push_rest`` queued behind it.
    def push_piece(self, worker: int, offset: int, values: np.ndarray, count: int, pulled_step: int | None,
                   sender: int | None) -> None:
        """Elements ``[offset, offset + len(values))`` of worker ``worker``'s next gradient (``count``: the
        shard's size in its layout); they cross the link now and wait for :meth:`push_rest`."""
        with self._lock:
            staged = self._staging_for(worker, count)
            staged.grad[offset:offset + values.size] = values
            staged.count(pulled_step)
            self.state.piece(values.nbytes)

    def push_rest(self, worker: int, pieces: int, ranges: list[tuple[int, int]], values: np.ndarray, count: int,
                  pulled_step: int | None = None, sent_at: float | None = None,
                  sender: int | None = None) -> tuple[np.ndarray, int, bool]:
        """The rest of a gradient whose ``pieces`` pieces came by :meth:`push_piece` (``values``: ``ranges``
        one after the other); applies the whole of it and returns what :meth:`push_pull` returns."""
        with self._lock:
            staged = self._staging_for(worker, count)
            got, staged.pieces = staged.pieces, (None, 0)
            if got != (pulled_step, pieces):  # this actor runs one call at a time, in order
                raise RuntimeError(f"shard {self.state.shard_id}: the push of worker {worker} came after "
                                   f"{got[1] if got[0] == pulled_step else 0} of its {pieces} pieces")
            sent = count - scatter_ranges(staged.grad, ranges, values)
            applied = self.state.serve(staged.grad, pulled_step, sent_at, sent_bytes=4 * sent)
            return self._params_out(), self.state.step, applied

    def forget(self, worker: int) -> None:
        """Worker ``worker`` is gone: drop its staged gradient pieces."""
        with self._lock:
            self._staging.pop(worker, None)


class SyncShardActor(_ShardActorBase):
    """Synchronous training: one averaged gradient per step from ``num_workers`` pushes.

    A round's gradients are summed in the order of their senders' data slots, not in arrival order:
    float addition is not associative, and an arrival-order sum made runs differ by rounding that a
    tie in a max-pool or ReLU could amplify into a different update (1e-3 after 12 steps). The
    gradients of a round are held until it completes (one shard-sized array per worker; a channel's
    gradient stays in the worker's shared memory, which the worker leaves alone while it waits).
    Everything runs on the actor's event loop; channel threads hand their pushes to it.
    """

    def __init__(self, shard_id: int, cfg: OptimizerConfig, max_step: int | None = None,
                 num_workers: int = 1, optimizer: str = "sgd"):
        self._init_base()
        self.state = ShardState(shard_id, cfg, max_step, optimizer)
        self.num_workers = num_workers
        self._size_epoch = -1  # the newest round-size change applied (they may arrive out of order)
        self._grads: list[tuple[int, int, np.ndarray]] = []  # (sender, arrival, gradient) of the round
        self._count = 0
        self._round: asyncio.Event | None = None  # created in the actor's event loop, on the first push
        self._link_lock: asyncio.Lock | None = None  # the emulated link carries one transfer at a time
        self._loop: asyncio.AbstractEventLoop | None = None

    async def push_pull(self, grad: np.ndarray, pulled_step: int | None = None,
                        sent_at: float | None = None, sender: int | None = None) -> tuple[np.ndarray, int, bool]:
        return await self._push(grad, sent_at, sender, None, 0)

    async def _push(self, grad: np.ndarray, sent_at: float | None, sender: int | None,
                    out: np.ndarray | None, sent_bytes: int) -> tuple[np.ndarray, int, bool]:
        """One push of a round; the parameters are copied into ``out`` (a channel's) as the round ends;
        ``sent_bytes`` of the gradient crossed the link before, as pieces."""
        self.state.note_arrival(sent_at)
        await self._transfer(max(0, grad.nbytes - sent_bytes))
        applied = not self.state.done
        if applied:
            arrival = self._count
            self._grads.append((arrival if sender is None else sender, arrival, grad))
            self._count += 1
            event = self._round
            if self._count >= self.num_workers:
                self._finish_round()
            else:
                await event.wait()
        self.state.count_pull()
        step = self.state.step
        if out is not None:
            self.state.copy_params_into(out)
            params = self.state.params
        else:
            params = self._params_out()
        await self._transfer(params.nbytes)
        return params, step, applied

    def _session(self, grad: np.ndarray, out: np.ndarray) -> SyncSession:
        return SyncSession(self, grad, out)

    # -- the Ray path's pieces: gathered per worker, the round takes the whole gradient ------------
    async def push_piece(self, worker: int, offset: int, values: np.ndarray, count: int,
                         pulled_step: int | None, sender: int | None) -> None:
        staged = self._staging_for(worker, count)
        staged.grad[offset:offset + values.size] = values
        async with staged.arrived:
            staged.count(pulled_step)
            staged.arrived.notify_all()
        await self._announced(values.nbytes)

    async def push_rest(self, worker: int, pieces: int, ranges: list[tuple[int, int]], values: np.ndarray,
                        count: int, pulled_step: int | None = None, sent_at: float | None = None,
                        sender: int | None = None) -> tuple[np.ndarray, int, bool]:
        staged = self._staging_for(worker, count)
        async with staged.arrived:  # an asyncio actor may start calls out of order: wait for every piece
            await staged.arrived.wait_for(lambda: staged.pieces == (pulled_step, pieces))
            staged.pieces = (None, 0)
        sent = count - scatter_ranges(staged.grad, ranges, values)
        # the round holds the gradient until it completes; the worker's next pieces come after its reply
        return await self._push(staged.grad, sent_at, sender, None, 4 * sent)

    async def forget(self, worker: int) -> None:
        self._staging.pop(worker, None)

    def _piece_signal(self) -> asyncio.Condition:
        return asyncio.Condition()

    async def _announced(self, nbytes: int) -> None:
        self.state.count_piece()
        await self._transfer(nbytes)

    async def _transfer(self, nbytes: int) -> None:
        if self._round is None:  # the first call on the actor's event loop
            self._round, self._link_lock = asyncio.Event(), asyncio.Lock()
        delay = self.state.link_delay_s(nbytes)
        if delay > 0:
            assert self._link_lock is not None
            async with self._link_lock:
                await asyncio.sleep(delay)
            self.state.note_link(delay)

    def _finish_round(self) -> None:
        assert self._grads
        ordered = [g for _, _, g in sorted(self._grads, key=lambda t: (t[0], t[1]))]
        acc = np.array(ordered[0], dtype=np.float32, copy=True)
        for g in ordered[1:]:
            acc += g
        if self._count > 1:
            acc /= np.float32(self._count)
        self.state.apply(acc)
        self._grads, self._count = [], 0
        event, self._round = self._round, asyncio.Event()
        event.set()

    async def set_num_workers(self, num_workers: int, epoch: int | None = None) -> None:
        """Change the barrier size (a worker left or joined); completes a waiting round if due.

        ``epoch`` numbers the changes in the order the coordinator made them: Ray does not keep an async
        actor's calls in submission order, so a change older than one already applied is ignored (a loss's
        shrink arriving after the replacement's growth would otherwise leave rounds one push short)."""
        if epoch is not None:
            if epoch < self._size_epoch:
                return
            self._size_epoch = epoch
        self.num_workers = max(1, int(num_workers))
        if self._count and self._count >= self.num_workers:
            self._finish_round()

    async def channel(self) -> tuple[str, ChannelAddress | None]:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        return _ShardActorBase.channel(self)

    async def tcp_channel(self) -> TcpChannelAddress | None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        return _ShardActorBase.tcp_channel(self)

    # control-plane methods must not block the event loop's pending rounds
    async def load(self, data: BlockData) -> int:  # type: ignore[override]
        return _ShardActorBase.load(self, data)

    async def pull(self) -> tuple[np.ndarray, int]:  # type: ignore[override]
        self.state.count_pull()
        params, step = self.state.params.copy(), self.state.step
        await self._transfer(params.nbytes)
        return params, step

    async def snapshot(self) -> BlockData:  # type: ignore[override]
        return self.state.snapshot()

    async def take(self, block_ids: list[int]) -> BlockData:  # type: ignore[override]
        return self.state.take(set(block_ids))

    async def add(self, data: BlockData) -> int:  # type: ignore[override]
        self.state.add(data)
        return self.state.step

    async def stats(self, reset: bool = True) -> ShardStats:  # type: ignore[override]
        return self.state.stats(reset)

    async def set_lr_scale(self, scale: float) -> None:  # type: ignore[override]
        self.state.lr_scale = float(scale)

    async def set_staleness_damping(self, on: bool) -> None:  # type: ignore[override]
        self.state.staleness_damping = bool(on)

    async def set_slowdown(self, factor: float) -> None:  # type: ignore[override]
        self.state.slowdown = max(1.0, float(factor))

    async def set_link(self, bytes_per_s: float | None) -> None:  # type: ignore[override]
        self.state.link_bytes_per_s = float(bytes_per_s) if bytes_per_s else None

    async def set_max_step(self, max_step: int | None) -> None:  # type: ignore[override]
        self.state.max_step = max_step

    async def ping(self) -> int:  # type: ignore[override]
        return self.state.step

    async def node_id(self) -> str:  # type: ignore[override]
        return _node_id()
