"""Parameter shards: the state (:class:`ShardState`) and its two Ray actor forms.

A shard holds its blocks in one flat float32 buffer with the momentum beside it and applies
the optimizer there. :class:`AsyncShard` applies every push at once (asynchronous training: the
global step counts applied pushes); :class:`SyncShard` averages one gradient per worker, applies
it once, and answers every waiting worker (synchronous training).

Both answer a push with the shard's parameters in the same call (push + pull is one round trip),
and the parameters travel as one array: Ray's object store hands it to the worker zero-copy.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from cmdare.ps.blocks import Block
from cmdare.ps.optimizer import UPDATE_CHUNK_ELEMS, OptimizerConfig, sgd_update


@dataclass(frozen=True)
class ShardStats:
    """Load counters of a shard over a window (since the previous ``stats(reset=True)``)."""

    shard_id: int
    step: int
    window_s: float
    pushes: int
    bytes_in: int
    bytes_out: int
    busy_s: float  # time serving pushes: the update, the emulated link and any injected slowdown
    num_params: int
    num_blocks: int
    apply_s: float = 0.0  # part of busy_s spent in the optimizer update (slowdown included)
    queue_s: float = 0.0  # summed over pushes: worker's send to the start of service (queue + transfer)
    wait_s: float = 0.0  # summed over pushes: worker-observed send-to-reply time (filled in by the coordinator)


@dataclass(frozen=True)
class BlockData:
    """Blocks with their parameter and momentum values, as moved between shards or checkpointed."""

    blocks: tuple[Block, ...]
    params: np.ndarray
    momentum: np.ndarray
    step: int


class ShardState:
    """A shard's buffers, optimizer and counters; no Ray in here, so it is tested directly."""

    def __init__(self, shard_id: int, cfg: OptimizerConfig, max_step: int | None = None):
        self.shard_id = shard_id
        self.cfg = cfg
        self.max_step = max_step
        self.lr_scale = 1.0
        self.staleness_damping = False  # staleness-aware LR: each push's lr divided by (1 + staleness)
        self.slowdown = 1.0  # straggler injection: every push takes this many times longer to serve
        self.link_bytes_per_s: float | None = None  # emulated network link of the shard's server
        self.step = 0
        self.blocks: list[Block] = []
        self.params = np.zeros(0, np.float32)
        self.momentum = np.zeros(0, np.float32)
        self._scratch = np.zeros(0, np.float32)
        self._reset_counters()

    # -- contents -------------------------------------------------------------------------
    def load(self, data: BlockData) -> None:
        """Replace the shard's contents (initial load, checkpoint restore)."""
        order = np.argsort([b.block_id for b in data.blocks], kind="stable")
        self.blocks = [data.blocks[i] for i in order]
        if list(order) != list(range(len(order))):
            raise ValueError("blocks must be given in block-id order")
        total = sum(b.size for b in self.blocks)
        if data.params.size != total or data.momentum.size != total:
            raise ValueError(f"shard {self.shard_id}: {data.params.size} values for {total} block elements")
        self.params = np.array(data.params, dtype=np.float32, copy=True)
        self.momentum = np.array(data.momentum, dtype=np.float32, copy=True)
        self._scratch = _scratch_for(self.params)
        self.step = data.step

    def snapshot(self) -> BlockData:
        """A copy of everything the shard holds."""
        return BlockData(tuple(self.blocks), self.params.copy(), self.momentum.copy(), self.step)

    def take(self, block_ids: set[int]) -> BlockData:
        """Remove ``block_ids`` and return them with their values and momentum (migration source)."""
        keep, out = self._split(block_ids)
        taken = BlockData(tuple(self.blocks[i] for i, _ in out),
                          _gather(self.params, out), _gather(self.momentum, out), self.step)
        self.blocks = [self.blocks[i] for i, _ in keep]
        self.params, self.momentum = _gather(self.params, keep), _gather(self.momentum, keep)
        self._scratch = _scratch_for(self.params)
        return taken

    def add(self, data: BlockData) -> None:
        """Insert moved blocks (migration destination); an empty shard adopts the step."""
        if not self.blocks:
            self.step = data.step
        merged = BlockData(tuple(self.blocks) + tuple(data.blocks),
                           np.concatenate([self.params, data.params]),
                           np.concatenate([self.momentum, data.momentum]), self.step)
        order = sorted(range(len(merged.blocks)), key=lambda i: merged.blocks[i].block_id)
        spans = _spans(merged.blocks)
        self.blocks = [merged.blocks[i] for i in order]
        self.params = _gather(merged.params, [(i, spans[i]) for i in order])
        self.momentum = _gather(merged.momentum, [(i, spans[i]) for i in order])
        self._scratch = _scratch_for(self.params)

    def _split(self, block_ids: set[int]) -> tuple[list, list]:
        spans = _spans(self.blocks)
        keep = [(i, spans[i]) for i, b in enumerate(self.blocks) if b.block_id not in block_ids]
        out = [(i, spans[i]) for i, b in enumerate(self.blocks) if b.block_id in block_ids]
        missing = block_ids - {b.block_id for b in self.blocks}
        if missing:
            raise KeyError(f"shard {self.shard_id} does not hold blocks {sorted(missing)}")
        return keep, out

    # -- training -------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.max_step is not None and self.step >= self.max_step

    def apply(self, grad: np.ndarray, pulled_step: int | None = None) -> bool:
        """Apply one (possibly averaged) gradient; False when the step budget is already reached.

        ``pulled_step`` is the global step of the parameters the gradient was computed on; with
        staleness damping the learning rate is divided by ``1 + staleness``.
        """
        if self.done:
            return False
        if grad.size != self.params.size:
            raise ValueError(f"shard {self.shard_id}: gradient of {grad.size} for {self.params.size} params")
        t0 = time.perf_counter()
        lr = self.cfg.lr_at(self.step, self.lr_scale)
        if self.staleness_damping and pulled_step is not None:
            lr /= 1 + max(0, self.step - pulled_step)
        sgd_update(self.params, grad, self.momentum, lr, self.cfg, self._scratch)
        self.step += 1
        elapsed = time.perf_counter() - t0
        if self.slowdown > 1.0:
            time.sleep(elapsed * (self.slowdown - 1.0))
        spent = time.perf_counter() - t0
        self._busy_s += spent
        self._apply_s += spent
        self._pushes += 1
        self._bytes_in += grad.nbytes
        return True

    def count_pull(self) -> None:
        self._bytes_out += self.params.nbytes

    def link_delay_s(self, nbytes: int) -> float:
        """Emulated transfer time of ``nbytes`` over the shard's link (0 without one), slowdown included."""
        if not self.link_bytes_per_s:
            return 0.0
        return nbytes / self.link_bytes_per_s * self.slowdown

    def serve(self, grad: np.ndarray, pulled_step: int | None, sent_at: float | None) -> bool:
        """One push and pull: queueing delay, the update, the reply and the emulated link time.

        ``sent_at`` is the worker's wall clock at sending (``time.time()``); the gap to the start of
        service is the push's queueing delay (it includes the transfer of the gradient).
        """
        self.note_arrival(sent_at)
        applied = self.apply(grad, pulled_step)
        self.count_pull()
        link = self.link_delay_s(grad.nbytes + self.params.nbytes)
        if link > 0:
            time.sleep(link)
            self.note_link(link)
        return applied

    def note_arrival(self, sent_at: float | None) -> None:
        """Count a push's queueing delay: from the worker's send (wall clock) to now."""
        if sent_at is not None:
            self._queue_s += max(0.0, time.time() - sent_at)

    def note_link(self, seconds: float) -> None:
        """Count time the shard's emulated link was busy as serving time."""
        self._busy_s += seconds

    def stats(self, reset: bool = True) -> ShardStats:
        now = time.perf_counter()
        s = ShardStats(self.shard_id, self.step, now - self._window_start, self._pushes, self._bytes_in,
                       self._bytes_out, self._busy_s, int(self.params.size), len(self.blocks), self._apply_s,
                       self._queue_s)
        if reset:
            self._reset_counters()
        return s

    def _reset_counters(self) -> None:
        self._window_start = time.perf_counter()
        self._pushes = self._bytes_in = self._bytes_out = 0
        self._busy_s = self._apply_s = self._queue_s = 0.0


def _scratch_for(params: np.ndarray) -> np.ndarray:
    """The update's scratch: one chunk (see :func:`sgd_update`), not a copy of the whole shard."""
    return np.empty(min(params.size, UPDATE_CHUNK_ELEMS), np.float32)


def _spans(blocks) -> list[tuple[int, int]]:
    spans, pos = [], 0
    for b in blocks:
        spans.append((pos, pos + b.size))
        pos += b.size
    return spans


def _gather(array: np.ndarray, picks) -> np.ndarray:
    if not picks:
        return np.zeros(0, np.float32)
    return np.concatenate([array[a:b] for _, (a, b) in picks]).astype(np.float32, copy=False)


class _ShardActorBase:
    """Methods shared by both actor forms (control plane: load, move, snapshot, stats)."""

    state: ShardState

    def load(self, data: BlockData) -> int:
        self.state.load(data)
        return self.state.step

    def pull(self) -> tuple[np.ndarray, int]:
        self.state.count_pull()
        return self.state.params, self.state.step

    def snapshot(self) -> BlockData:
        return self.state.snapshot()

    def take(self, block_ids: list[int]) -> BlockData:
        return self.state.take(set(block_ids))

    def add(self, data: BlockData) -> int:
        self.state.add(data)
        return self.state.step

    def stats(self, reset: bool = True) -> ShardStats:
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
        import ray

        return ray.get_runtime_context().get_node_id()


class AsyncShardActor(_ShardActorBase):
    """Asynchronous training: each push is applied on arrival; calls run one at a time."""

    def __init__(self, shard_id: int, cfg: OptimizerConfig, max_step: int | None = None):
        self.state = ShardState(shard_id, cfg, max_step)

    def push_pull(self, grad: np.ndarray, pulled_step: int | None = None,
                  sent_at: float | None = None, sender: int | None = None) -> tuple[np.ndarray, int, bool]:
        """Apply ``grad``; return (parameters, global step after it, whether it was applied).
        ``sender`` (the worker's data slot) matters only to synchronous shards."""
        applied = self.state.serve(grad, pulled_step, sent_at)
        # Returned without a copy: Ray serialises the result before this actor runs the next call.
        return self.state.params, self.state.step, applied


class SyncShardActor(_ShardActorBase):
    """Synchronous training: one averaged gradient per step from ``num_workers`` pushes.

    A round's gradients are summed in the order of their senders' data slots, not in arrival order:
    float addition is not associative, and an arrival-order sum made runs differ by rounding that a
    tie in a max-pool or ReLU could amplify into a different update (1e-3 after 12 steps). The
    gradients of a round are held until it completes (one shard-sized array per worker).
    """

    def __init__(self, shard_id: int, cfg: OptimizerConfig, max_step: int | None = None,
                 num_workers: int = 1):
        self.state = ShardState(shard_id, cfg, max_step)
        self.num_workers = num_workers
        self._grads: list[tuple[int, int, np.ndarray]] = []  # (sender, arrival, gradient) of the round
        self._count = 0
        self._round: asyncio.Event | None = None  # created in the actor's event loop, on the first push
        self._link_lock: asyncio.Lock | None = None  # the emulated link carries one transfer at a time

    async def push_pull(self, grad: np.ndarray, pulled_step: int | None = None,
                        sent_at: float | None = None, sender: int | None = None) -> tuple[np.ndarray, int, bool]:
        if self._round is None:
            self._round, self._link_lock = asyncio.Event(), asyncio.Lock()
        self.state.note_arrival(sent_at)
        await self._transfer(grad.nbytes)
        if self.state.done:
            self.state.count_pull()
            await self._transfer(self.state.params.nbytes)
            return self.state.params, self.state.step, False
        arrival = self._count
        self._grads.append((arrival if sender is None else sender, arrival, grad))
        self._count += 1
        event = self._round
        if self._count >= self.num_workers:
            self._finish_round()
        else:
            await event.wait()
        self.state.count_pull()
        params, step = self.state.params, self.state.step
        await self._transfer(params.nbytes)
        return params, step, True

    async def _transfer(self, nbytes: int) -> None:
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

    async def set_num_workers(self, num_workers: int) -> None:
        """Change the barrier size (a worker left or joined); completes a waiting round if due."""
        self.num_workers = max(1, int(num_workers))
        if self._count and self._count >= self.num_workers:
            self._finish_round()

    # control-plane methods must not block the event loop's pending rounds
    async def load(self, data: BlockData) -> int:  # type: ignore[override]
        return _ShardActorBase.load(self, data)

    async def pull(self) -> tuple[np.ndarray, int]:  # type: ignore[override]
        self.state.count_pull()
        return self.state.params.copy(), self.state.step

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
        import ray

        return ray.get_runtime_context().get_node_id()
