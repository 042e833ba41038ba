"""A parameter shard's state: its blocks in one flat float32 buffer, the optimizer's state beside it (SGD's
momentum, or any other optimizer's :class:`~cmdare.ps.shard_optimizer.OptimizerSlots`), the optimizer applied
there, and its load counters. No Ray in here (the actors are in :mod:`cmdare.ps.shard`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from cmdare.ps.blocks import Block
from cmdare.ps.optimizer import UPDATE_CHUNK_ELEMS, OptimizerConfig, sgd_update
from cmdare.ps.shard_optimizer import OptimizerSlots, gather_elements, shard_optimizer


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
    pieces: int = 0  # gradient pieces announced ahead of their pushes (communication overlapped with backward)
    pieces_applied: int = 0  # of those, pieces updated on arrival, their parameters sent back at once


@dataclass(frozen=True)
class BlockData:
    """Blocks with their parameter values and optimizer state, as moved between shards or checkpointed.

    ``momentum`` is SGD's (zeros with another optimizer); ``optimizer`` is another optimizer's state (None with
    SGD, or for blocks that optimizer has not updated yet)."""

    blocks: tuple[Block, ...]
    params: np.ndarray
    momentum: np.ndarray
    step: int
    optimizer: OptimizerSlots | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of values and state (what a move carries)."""
        return self.params.nbytes + self.momentum.nbytes + (self.optimizer.nbytes if self.optimizer else 0)


#: Early-applied pieces start and end on multiples of this many elements (of the shard's buffer), so each
#: element goes through the same vector or scalar code as in a whole-buffer update on any CPU.
PIECE_ALIGN = 64


@dataclass
class OpenPush:
    """A push whose gradient comes in pieces (:meth:`ShardState.open_push`): its step is claimed and its
    learning rate fixed when the first piece arrives; ``applied`` are the ranges updated so far."""

    lr: float
    applied: list[tuple[int, int]] = field(default_factory=list)
    returned: int = 0  # bytes of parameters that went back over the link with the pieces

    def rest(self, n: int) -> list[tuple[int, int]]:
        """The ranges of ``[0, n)`` not updated yet."""
        return complement(self.applied, n)


def complement(ranges: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The ranges of ``[0, n)`` that ``ranges`` leave out, in order."""
    out, pos = [], 0
    for lo, hi in sorted(ranges):
        if lo > pos:
            out.append((pos, lo))
        pos = max(pos, hi)
    if pos < n:
        out.append((pos, n))
    return out


class ShardState:
    """A shard's buffers, optimizer and counters; no Ray in here, so it is tested directly."""

    def __init__(self, shard_id: int, cfg: OptimizerConfig, max_step: int | None = None, optimizer: str = "sgd"):
        self.shard_id = shard_id
        self.cfg = cfg
        self.optimizer = shard_optimizer(optimizer, cfg)  # None: SGD's fast path on ``momentum``
        self.max_step = max_step
        self.lr_scale = 1.0
        self.staleness_damping = False  # staleness-aware LR: each push's lr divided by (1 + staleness)
        self.slowdown = 1.0  # straggler injection: every push takes this many times longer to serve
        self.link_bytes_per_s: float | None = None  # emulated network link of the shard's server
        self.step = 0
        self.blocks: list[Block] = []
        self.params = np.zeros(0, np.float32)
        self.momentum = np.zeros(0, np.float32)
        self.slots = self.optimizer.empty(0, 0) if self.optimizer is not None else None
        self._spans: list[tuple[int, int]] = []
        self._scratch = np.zeros(0, np.float32)
        self.open_pushes = 0  # pushes whose pieces are being applied (async shards)
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
        self.slots = self._slots_of(data)
        self._laid_out()
        self.step = data.step

    def snapshot(self) -> BlockData:
        """A copy of everything the shard holds."""
        return BlockData(tuple(self.blocks), self.params.copy(), self.momentum.copy(), self.step,
                         self.slots.copy() if self.slots is not None else None)

    def take(self, block_ids: set[int]) -> BlockData:
        """Remove ``block_ids`` and return them with their values and momentum (migration source)."""
        keep, out = self._split(block_ids)
        taken = BlockData(tuple(self.blocks[i] for i, _ in out), gather_elements(self.params, out),
                          gather_elements(self.momentum, out), self.step,
                          self.slots.gather(out) if self.slots is not None else None)
        self.blocks = [self.blocks[i] for i, _ in keep]
        self.params, self.momentum = gather_elements(self.params, keep), gather_elements(self.momentum, keep)
        if self.slots is not None:
            self.slots = self.slots.gather(keep)
        self._laid_out()
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
        picks = [(i, spans[i]) for i in order]
        self.blocks = [merged.blocks[i] for i in order]
        self.params = gather_elements(merged.params, picks)
        self.momentum = gather_elements(merged.momentum, picks)
        if self.slots is not None:
            self.slots = self.slots.concat(self._slots_of(data)).gather(picks)
        self._laid_out()

    def _slots_of(self, data: BlockData) -> OptimizerSlots | None:
        """The optimizer state ``data`` brings (none yet for its blocks: empty), checked against its blocks."""
        if self.optimizer is None:
            return None
        if data.optimizer is None:
            return self.optimizer.empty(data.params.size, len(data.blocks))
        data.optimizer.check(data.params.size, len(data.blocks))
        return data.optimizer.copy()

    def _laid_out(self) -> None:
        """The blocks changed: the update's block spans and scratch follow."""
        self._spans = _spans(self.blocks)
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

    def apply(self, grad: np.ndarray, pulled_step: int | None = None, out: np.ndarray | None = None) -> bool:
        """Apply one (possibly averaged) gradient; False when the step budget is already reached.

        ``pulled_step`` is the global step of the parameters the gradient was computed on; with
        staleness damping the learning rate is divided by ``1 + staleness``. ``out`` receives the
        parameters after the update (see :func:`sgd_update`); it is left alone when False is returned.
        """
        if self.done:
            return False
        self._check_grad(grad)
        lr = self._lr(pulled_step)
        self._update(0, self.params.size, grad, lr, out)
        self.step += 1
        self._pushes += 1
        self._bytes_in += grad.nbytes
        return True

    def _lr(self, pulled_step: int | None) -> float:
        lr = self.cfg.lr_at(self.step, self.lr_scale)
        if self.staleness_damping and pulled_step is not None:
            lr /= 1 + max(0, self.step - pulled_step)
        return lr

    def _check_grad(self, grad: np.ndarray) -> None:
        if grad.size != self.params.size:
            raise ValueError(f"shard {self.shard_id}: gradient of {grad.size} for {self.params.size} params")

    def _update(self, lo: int, hi: int, grad: np.ndarray, lr: float, out: np.ndarray | None) -> None:
        """The optimizer on elements ``[lo, hi)`` (``out``, if given, receives them), slowdown and time counted."""
        t0 = time.perf_counter()
        if self.optimizer is not None and self.slots is not None:
            if (lo, hi) != (0, self.params.size):
                raise ValueError(f"--optimizer {self.optimizer.name} updates a shard's blocks whole")
            self.optimizer.update(self.params, grad, self.slots, self._spans, lr)
            if out is not None:
                np.copyto(out, self.params)
        else:
            sgd_update(self.params[lo:hi], grad[lo:hi], self.momentum[lo:hi], lr, self.cfg, self._scratch,
                       None if out is None else out[lo:hi])
        if self.slowdown > 1.0:
            time.sleep((time.perf_counter() - t0) * (self.slowdown - 1.0))
        spent = time.perf_counter() - t0
        self._busy_s += spent
        self._apply_s += spent

    # -- pushes that come in pieces (asynchronous shards) ------------------------------------
    def open_push(self, grad: np.ndarray, pulled_step: int | None) -> OpenPush | None:
        """Claim the next step for a push whose pieces are coming (None when the step budget is reached).

        The claim counts as a step at once, so a step budget is never overrun; the learning rate is the
        one :meth:`apply` would use now. Until :meth:`close_push` the shard holds part of an update:
        whoever needs a whole-step state waits for ``open_pushes`` to reach 0.
        """
        if self.done:
            return None
        self._check_grad(grad)
        push = OpenPush(self._lr(pulled_step))
        self.step += 1
        self.open_pushes += 1
        return push

    def apply_piece(self, push: OpenPush, grad: np.ndarray, out: np.ndarray, lo: int, hi: int) -> int:
        """Update elements ``[lo, hi)`` (trimmed to :data:`PIECE_ALIGN`) of an open push and write them into
        ``out``; returns how many were updated (the rest waits for the push)."""
        self._check_grad(grad)
        self._check_out(out)
        if self.optimizer is not None:  # its update takes the shard's blocks whole: all of it waits for the push
            return 0
        lo = -(-max(0, lo) // PIECE_ALIGN) * PIECE_ALIGN
        hi = min(hi, self.params.size)
        if hi < self.params.size:
            hi = hi // PIECE_ALIGN * PIECE_ALIGN
        if hi <= lo:
            return 0
        self._update(lo, hi, grad, push.lr, out)
        push.applied.append((lo, hi))
        self._pieces_applied += 1
        return hi - lo

    def close_push(self, push: OpenPush, grad: np.ndarray, out: np.ndarray | None) -> None:
        """Complete an open push: update what its pieces did not."""
        try:
            self._check_grad(grad)
            for lo, hi in push.rest(self.params.size):
                self._update(lo, hi, grad, push.lr, out)
            self._pushes += 1
            self._bytes_in += grad.nbytes
        finally:
            self.open_pushes -= 1

    def abandon_push(self, push: OpenPush) -> None:
        """An open push whose worker went away: its step stays counted and its pieces applied (a partial
        gradient, as asynchronous training may see from a worker that dies mid-push)."""
        self.open_pushes -= 1

    def count_pull(self) -> None:
        self._bytes_out += self.params.nbytes

    def link_delay_s(self, nbytes: int) -> float:
        """Emulated transfer time of ``nbytes`` over the shard's link (0 without one), slowdown included."""
        if not self.link_bytes_per_s:
            return 0.0
        return nbytes / self.link_bytes_per_s * self.slowdown

    def serve(self, grad: np.ndarray, pulled_step: int | None, sent_at: float | None,
              out: np.ndarray | None = None, sent_bytes: int = 0, push: OpenPush | None = None) -> bool:
        """One push and pull: queueing delay, the update, the reply and the emulated link time.

        ``sent_at`` is the worker's wall clock at sending (``time.time()``); the gap to the start of
        service is the push's queueing delay (it includes the transfer of the gradient). ``out``
        receives the parameters (a same-node worker's memory), also when the push is not applied.
        ``sent_bytes`` of the gradient crossed the link before, as pieces (:meth:`transfer`); ``push``
        is the open push those pieces started (they were applied and their parameters went back).
        """
        self.note_arrival(sent_at)
        if out is not None:
            try:
                self._check_out(out)
            except ValueError:
                if push is not None:
                    self.abandon_push(push)
                raise
        if push is None:
            applied = self.apply(grad, pulled_step, out)
        else:
            self.close_push(push, grad, out)
            applied = True
        if out is not None and not applied:
            np.copyto(out, self.params)
        self.count_pull()
        self.transfer(max(0, grad.nbytes - sent_bytes) + max(0, self.params.nbytes - (push.returned if push else 0)))
        return applied

    def piece(self, nbytes: int) -> None:
        """A piece of a worker's next gradient is ready: its ``nbytes`` cross the link now."""
        self.count_piece()
        self.transfer(nbytes)

    def count_piece(self) -> None:
        self._pieces += 1

    def copy_params_into(self, out: np.ndarray) -> None:
        """Write the parameters into ``out`` (a same-node worker's memory for this shard)."""
        self._check_out(out)
        np.copyto(out, self.params)

    def _check_out(self, out: np.ndarray) -> None:
        self.check_size(out.size)

    def check_size(self, count: int) -> None:
        """Raise ValueError unless a worker's view of this shard (``count`` values) matches it."""
        if count != self.params.size:
            raise ValueError(f"shard {self.shard_id} holds {self.params.size} values, the worker's buffer "
                             f"{count}: its layout is stale")

    def transfer(self, nbytes: int) -> None:
        """``nbytes`` cross the shard's emulated link (a sleep, counted as serving time); nothing without one."""
        link = self.link_delay_s(nbytes)
        if link > 0:
            time.sleep(link)
            self.note_link(link)

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
                       self._queue_s, pieces=self._pieces, pieces_applied=self._pieces_applied)
        if reset:
            self._reset_counters()
        return s

    def _reset_counters(self) -> None:
        self._window_start = time.perf_counter()
        self._pushes = self._bytes_in = self._bytes_out = self._pieces = self._pieces_applied = 0
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

