"""Deterministic sharding of the training data across workers: :class:`BatchStream`.

Epoch ``e`` draws one permutation of the training indices from ``(seed, e)``; worker ``w`` of ``K``
takes ``perm[w::K]`` and cuts it into batches of ``batch_size`` in order, dropping the incomplete tail.
Every worker gets the same number of batches per epoch, ``(N // K) // batch_size``. So:

* the stream is a pure function of ``(seed, worker_index, num_workers, batch_size, position)``, and a
  worker can resume anywhere with :meth:`BatchStream.skip` or ``start_batch``;
* with ``K = 1`` it is exactly the batch sequence a single-process loop gets from the same class;
* for synchronous training, batch ``t`` of the ``K`` workers together holds exactly the samples of
  batch ``t`` of a single stream with ``batch_size * K`` (interleaved), so ``K`` synchronous workers
  averaging their gradients see the same data as one process with the ``K`` times larger batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from cmdare.errors import UserInputError

if TYPE_CHECKING:
    import torch

    from cmdare.datasets.base import Dataset

__all__ = ["BatchError", "BatchStream", "MapSamples", "epoch_permutation", "take_batch"]


class BatchError(UserInputError):
    """A batch of the user's data could not be made: ``label`` names the dataset (``--dataset mypkg.data:make``),
    ``detail`` says what failed (an item that raised or is None, items that do not collate, a length too large to
    shuffle). The training step adds where it happened."""

    def __init__(self, label: str, detail: str):
        super().__init__(label, detail)
        self.label, self.detail = label, detail

    def __str__(self) -> str:
        return f"{self.label}: {self.detail}"


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``range(num_samples)`` for ``epoch`` (numpy PCG64 seeded by ``[seed, epoch]``)."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def take_batch(data: Any, idx: torch.Tensor) -> tuple[Any, Any]:
    """The samples ``idx`` of ``data`` as one ``(inputs, targets)`` batch: rows of a tuple of tensors, or a
    map-style dataset's items (``(input, target)`` pairs) put together by its collate function
    (:class:`MapSamples`; ``torch.utils.data.default_collate`` by default).

    Raises:
        UserInputError: an item is not an ``(input, target)`` pair.
    """
    if isinstance(data, tuple):
        return data[0][idx], data[1][idx]
    return data.batch(idx)


class MapSamples:
    """A map-style dataset (``__len__`` and ``__getitem__`` giving ``(input, target)``), batched by
    ``collate`` (default: ``torch.utils.data.default_collate``); ``label`` names it in errors."""

    def __init__(self, dataset: Any, collate: Any = None, label: str = "the dataset"):
        self.dataset, self.collate, self.label = dataset, collate, label

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, idx: torch.Tensor) -> tuple[Any, Any]:
        """Items ``idx`` collated into ``(inputs, targets)``.

        Raises:
            BatchError: an item raised or is None, the items do not collate, or a batch is no pair.
        """
        from torch.utils.data import default_collate

        from cmdare.workloads.user_code import describe

        items = []
        for i in idx.tolist():
            try:
                item = self.dataset[i]
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's __getitem__: one line
                raise BatchError(self.label, f"item {i} raised {describe(err)}") from None
            if item is None:
                raise BatchError(self.label, f"item {i} is None, not an (input, target) pair")
            items.append(item)
        try:
            batch = (self.collate or default_collate)(items)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - items of different shapes or types: one line
            which = _mismatch(items, idx.tolist()) or f"items {_some(idx)}"
            raise BatchError(self.label, f"{which} could not be collated into a batch ({describe(err)})") from None
        if not isinstance(batch, tuple | list) or len(batch) != 2:
            raise BatchError(self.label, "an item must be an (input, target) pair; a batch of them collated "
                             f"to {type(batch).__name__}")
        return batch[0], batch[1]


def _mismatch(items: list[Any], indices: list[int]) -> str | None:
    """``item 3's input has shape (16,), item 7's (8,)``: the first item whose input or target differs in shape
    from the batch's first item (None: their shapes agree)."""
    def shapes(item: Any) -> tuple[Any, Any] | None:
        if not isinstance(item, tuple | list) or len(item) != 2:
            return None
        return tuple(getattr(item[0], "shape", ())), tuple(getattr(item[1], "shape", ()))

    first = shapes(items[0])
    for i, item in zip(indices[1:], items[1:], strict=True):
        other = shapes(item)
        if first is None or other is None:
            return None
        for part, a, b in (("input", first[0], other[0]), ("target", first[1], other[1])):
            if a != b:
                return f"item {i}'s {part} has shape {b}, item {indices[0]}'s {a}: items"
    return None


def _some(idx: torch.Tensor, shown: int = 4) -> str:
    """The first indices of a batch: ``3, 17, 40, 2, ... (32 items)``."""
    values = idx.tolist()
    more = f", ... ({len(values)} items)" if len(values) > shown else ""
    return ", ".join(map(str, values[:shown])) + more


class BatchStream(Iterator[tuple["torch.Tensor", "torch.Tensor"]]):
    """An infinite, deterministic iterator of one worker's ``(x, y)`` training batches.

    Args:
        data: a :class:`~cmdare.datasets.Dataset` (its training split is used), a tuple ``(x, y)``
            of tensors with the same first dimension, or a :class:`MapSamples` (a map-style dataset).
        worker_index: this worker's index in ``[0, num_workers)``.
        num_workers: number of workers sharing the data.
        batch_size: samples per batch.
        seed: non-negative seed of the per-epoch permutations (the same on every worker).
        start_batch: position to start at (batches already consumed), e.g. from a checkpoint.

    Raises:
        UserInputError: bad indices or sizes, or a shard smaller than one batch.
    """

    def __init__(
        self,
        data: Dataset | tuple[torch.Tensor, torch.Tensor],
        worker_index: int,
        num_workers: int,
        batch_size: int,
        seed: int,
        *,
        start_batch: int = 0,
    ):

        if isinstance(data, MapSamples):
            self.samples: tuple[Any, Any] | MapSamples = data
        else:
            x, y = (data.train_x, data.train_y) if hasattr(data, "train_x") else data  # type: ignore[union-attr, misc]
            if len(x) != len(y):
                raise UserInputError(f"x and y differ in length: {len(x)} vs {len(y)}")
            self.samples = (x, y)
        if not isinstance(num_workers, int) or num_workers < 1:
            raise UserInputError(f"num_workers must be >= 1, got {num_workers!r}")
        if not isinstance(worker_index, int) or not 0 <= worker_index < num_workers:
            raise UserInputError(f"worker_index must be in [0, {num_workers}), got {worker_index!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise UserInputError(f"batch_size must be >= 1, got {batch_size!r}")
        if not isinstance(seed, int) or seed < 0:
            raise UserInputError(f"seed must be a non-negative integer, got {seed!r}")
        if start_batch < 0:
            raise UserInputError(f"start_batch must be >= 0, got {start_batch}")
        self.worker_index, self.num_workers = worker_index, num_workers
        self.batch_size, self.seed = batch_size, seed
        self.num_samples = int(len(self.samples[0]) if isinstance(self.samples, tuple) else len(self.samples))
        self.batches_per_epoch = (self.num_samples // num_workers) // batch_size
        if self.batches_per_epoch == 0:
            raise UserInputError(
                f"{self.num_samples} samples over {num_workers} workers give less than one batch "
                f"of {batch_size}"
            )
        self._position = int(start_batch)
        self._epoch_cached = -1
        self._shard: torch.Tensor | None = None

    @property
    def position(self) -> int:
        """Batches consumed so far (across epochs); the next batch has this index."""
        return self._position

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._position // self.batches_per_epoch

    def skip(self, n_batches: int) -> BatchStream:
        """Advance ``n_batches`` without building them; returns ``self``."""
        if n_batches < 0:
            raise UserInputError(f"cannot skip a negative number of batches: {n_batches}")
        self._position += int(n_batches)
        return self

    def seek(self, position: int) -> BatchStream:
        """Jump to absolute batch ``position`` (as from :attr:`position`); returns ``self``."""
        if position < 0:
            raise UserInputError(f"position must be >= 0, got {position}")
        self._position = int(position)
        return self

    def batch_indices(self, position: int) -> torch.Tensor:
        """Training-set indices (int64) of the batch at ``position``."""
        import torch

        epoch, b = divmod(position, self.batches_per_epoch)
        if epoch != self._epoch_cached:
            try:
                perm = epoch_permutation(self.num_samples, self.seed, epoch)
            except (MemoryError, ValueError) as err:  # a __len__ of 1e12: 7.3 TiB of indices
                from cmdare.workloads.user_code import describe

                label = self.samples.label if isinstance(self.samples, MapSamples) else "the dataset"
                raise BatchError(label, f"its length {self.num_samples:,} is too large to shuffle in memory "
                                 f"({describe(err)})") from None
            self._shard = torch.from_numpy(perm[self.worker_index :: self.num_workers].astype(np.int64))
            self._epoch_cached = epoch
        assert self._shard is not None
        return self._shard[b * self.batch_size : (b + 1) * self.batch_size]

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.batch_indices(self._position)
        self._position += 1
        return take_batch(self.samples, idx)

    def __repr__(self) -> str:
        return (
            f"BatchStream(worker {self.worker_index}/{self.num_workers}, batch {self.batch_size}, "
            f"seed {self.seed}, position {self._position}, {self.batches_per_epoch} batches/epoch)"
        )
