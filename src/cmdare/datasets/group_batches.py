"""The training data of an elastic all-reduce group: one epoch permutation read by a shared cursor.

Epoch ``e`` draws the same permutation as :class:`~cmdare.datasets.BatchStream` (:func:`epoch_permutation` of
``(seed, e)``). Each step the group's ``size`` members together take the next ``size * batch_size`` samples:
member ``rank`` takes the ``rank``-th run of ``batch_size`` of them. With a ``global_batch`` the step takes that
many samples whatever the size, cut into ``size`` runs that differ by at most one sample (the first
``global_batch % size`` members take one more). A step that does not fit in what is left of
the epoch starts the next one (the tail is dropped, as :class:`BatchStream` drops it). The position is the pair
``(epoch, cursor)``, the same on every member, so when the group is re-formed at another size the members go on
from it: no sample of an epoch is skipped or taken twice across re-formations (beyond the dropped tail), and a
newcomer continues from a peer's position. With one member it is exactly ``BatchStream``'s single-worker order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cmdare.datasets.sharding import MapSamples, epoch_permutation, take_batch
from cmdare.errors import UserInputError

if TYPE_CHECKING:
    import torch

__all__ = ["GroupBatches"]


class GroupBatches:
    """Member ``rank`` of ``size``'s batches of ``data`` (an iterator; :meth:`regroup` on a re-formation)."""

    def __init__(self, data: tuple[Any, Any] | MapSamples, batch_size: int, seed: int,
                 epoch: int = 0, cursor: int = 0, global_batch: int | None = None):
        if batch_size < 1 or (global_batch is not None and global_batch < 1):
            raise UserInputError(f"batch sizes must be >= 1, got {batch_size} and {global_batch}")
        self.samples, self.batch_size, self.seed = data, batch_size, seed
        self.global_batch = global_batch
        self.num_samples = int(len(data[0]) if isinstance(data, tuple) else len(data))
        self.epoch, self.cursor = int(epoch), int(cursor)
        self.rank, self.size = 0, 1
        self.position = 0  # batches taken by this member (named in an error of the user's data)
        self._perm: tuple[int, torch.Tensor] | None = None

    def regroup(self, rank: int, size: int) -> None:
        """The group is now ``size`` members and this one is ``rank``.

        Raises:
            UserInputError: the training set holds less than one step of ``size`` members.
        """
        if self.global_batch is not None and size > self.global_batch:
            raise UserInputError(f"a global batch of {self.global_batch} cannot be shared by {size} members")
        self.rank, self.size = rank, size
        if self.step_samples > self.num_samples:
            raise UserInputError(f"{self.num_samples} training samples hold less than one step of {size} members "
                                 f"({self.step_samples} samples)")

    @property
    def step_samples(self) -> int:
        """Samples the group takes in one step."""
        return self.global_batch if self.global_batch is not None else self.size * self.batch_size

    def piece(self, rank: int | None = None) -> tuple[int, int]:
        """``(offset, count)`` of member ``rank``'s samples (default this member's) within the group's step."""
        rank = self.rank if rank is None else rank
        if self.global_batch is None:
            return rank * self.batch_size, self.batch_size
        base, extra = divmod(self.global_batch, self.size)
        return rank * base + min(rank, extra), base + (rank < extra)

    @property
    def where(self) -> tuple[int, int]:
        """``(epoch, cursor)``: where the group's next step starts."""
        return self.epoch, self.cursor

    def seek(self, epoch: int, cursor: int) -> None:
        """Go to ``(epoch, cursor)`` (a peer's :attr:`where`, or the position before a step that was lost)."""
        self.epoch, self.cursor = int(epoch), int(cursor)

    def step_indices(self) -> torch.Tensor:
        """This member's training-set indices for the group's next step (the position is not moved)."""
        import torch

        epoch, cursor = self._fit()
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, torch.from_numpy(epoch_permutation(self.num_samples, self.seed, epoch)))
        offset, count = self.piece()
        return self._perm[1][cursor + offset:cursor + offset + count]

    def _fit(self) -> tuple[int, int]:
        if self.cursor + self.step_samples > self.num_samples:
            return self.epoch + 1, 0
        return self.epoch, self.cursor

    def __iter__(self) -> GroupBatches:
        return self

    def __next__(self) -> tuple[Any, Any]:
        idx = self.step_indices()
        self.epoch, self.cursor = self._fit()
        self.cursor += self.step_samples
        self.position += 1
        return take_batch(self.samples, idx)
