"""Checkpoint uploads off the training path: the chief's snapshot is stored on a background thread.

The chief worker only snapshots the shards (its stall); the coordinator, which runs on the
on-demand head, hands the snapshot to :class:`CheckpointUploads`, which encodes it and writes it to
the run's storage on one background thread, in order. Training goes on meanwhile; the coordinator
collects finished uploads at its next tick (:meth:`CheckpointUploads.finished`) and reports each
checkpoint once it is durable. Nothing here depends on a transient server's disk.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore, SavedCheckpoint

__all__ = ["CheckpointUploads", "Upload"]


@dataclass
class Upload:
    """One checkpoint on its way to storage.

    ``stall_s`` is what training waited for: the chief's snapshot (measured in the chief), plus the
    upload when it is not in the background; ``ready_s`` the time from the duty's start until the
    snapshot reached the coordinator (it includes the chief finishing its current chunk);
    ``upload_s`` the time to encode and write it; ``error`` why it failed.
    """

    step: int
    worker_id: int
    num_tensors: int
    stall_s: float
    ready_s: float
    started_at: float  # wall clock: when the checkpoint duty began
    saved: SavedCheckpoint | None = None
    upload_s: float = 0.0
    error: Exception | None = None

    @property
    def duration_s(self) -> float:
        """Duty start to durable: what a checkpoint costs end to end."""
        return self.ready_s + self.upload_s


class CheckpointUploads:
    """Stores snapshots in ``store`` on a background thread (``background=False``: in the caller)."""

    def __init__(self, store: CheckpointStore, background: bool = True):
        self.store, self.background = store, background
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cmdare-checkpoint-upload")
        self._pending: list[Future[Upload]] = []
        self._done: list[Upload] = []

    def submit(self, ckpt: Checkpoint, upload: Upload) -> None:
        """Queue ``ckpt`` for storage (or store it now when not in the background)."""
        if self.background:
            self._pending.append(self._pool.submit(self._store, ckpt, upload))
        else:
            self._done.append(self._store(ckpt, upload))
            upload.stall_s += upload.upload_s

    def finished(self, wait: bool = False, timeout_s: float | None = None) -> list[Upload]:
        """Uploads that ended (stored or failed) since the last call; with ``wait``, first wait for all
        (at most ``timeout_s``)."""
        if wait and self._pending:
            wait_futures(self._pending, timeout=timeout_s)
        out, self._done = self._done, []
        ended = [f for f in self._pending if f.done()]  # once: an upload may end between two looks
        self._pending = [f for f in self._pending if f not in ended]
        return out + [f.result() for f in ended]

    def close(self) -> None:
        """Stop the background thread: uploads not started are dropped, a running one is not waited for
        (call :meth:`finished` with ``wait`` first to let them end)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _store(self, ckpt: Checkpoint, upload: Upload) -> Upload:
        t0 = time.perf_counter()
        try:
            upload.saved = self.store.save(ckpt)
        except Exception as err:  # noqa: BLE001 - reported as the upload's failure; the previous one stays valid
            upload.error = err
        upload.upload_s = time.perf_counter() - t0
        return upload
