"""Communication overlapped with backward: pieces of a shard's gradient leave as backward produces them.

Backward computes gradients from the last layer to the first. Each shard's range of the flat gradient is
cut, at parameter boundaries, into pieces of about equal size; a hook on every parameter
(``register_post_accumulate_grad_hook``) counts the piece's parameters done, and the moment a piece is
complete it is announced to its shard, which carries it over its link while backward goes on (as
BytePS and Poseidon push layer by layer). On a channel an asynchronous shard also applies the piece
at once and writes its parameters back, so the next parameters are pulled in the same order, during
backward too: a parameter whose gradient is final is not read again by this backward. The push after backward
then carries only what is left. The update of every element is the one a whole push makes, so
training is unchanged.

On same-node channels (:mod:`cmdare.ps.channel`) a piece is an announcement: the gradient already lies
in shared memory and the emulated link (``--ps-bandwidth``) is what takes time. A shard reached
through Ray gets the piece's values in a ``push_piece`` call and stages them until the push, which
applies the whole gradient (see :func:`pieced_shard` for when pieces are sent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from cmdare.train.spec import TrainSpec

#: Pieces each shard's range is cut into (fewer when it holds fewer parameters).
PIECES_PER_SHARD = 4
#: A shard reached through Ray gets pieces only from this size on (each piece is a Ray call), or over an
#: emulated link; below it one push after backward costs less than the calls.
RAY_PIECES_MIN_BYTES = 4 << 20


def pieced_shard(spec: TrainSpec, by_channel: bool, shard_range: tuple[int, int]) -> bool:
    """Whether a worker sends shard ``shard_range``'s gradient in pieces during backward: with overlap on,
    over an emulated link (``--ps-bandwidth``), or through Ray for a shard of at least
    :data:`RAY_PIECES_MIN_BYTES` (a same-node channel's gradient is already in shared memory)."""
    if not spec.overlap:
        return False
    if spec.ps_bandwidth:
        return True
    return not by_channel and 4 * (shard_range[1] - shard_range[0]) >= RAY_PIECES_MIN_BYTES


class GradientPieces:
    """The pieces of shards ``shards`` (placement indices) of a layout, and the hooks that announce them.

    ``announce(shard, lo, hi)`` is called from backward when a piece is complete: elements ``[lo, hi)``
    of the shard's range. :meth:`arm` before backward, :meth:`finish` after it: the elements announced
    per shard.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], spans: dict[int, tuple[int, int]],
                 shard_ranges: Sequence[tuple[int, int]], shards: Sequence[int],
                 announce: Callable[[int, int, int], None], pieces_per_shard: int = PIECES_PER_SHARD):
        self._announce = announce
        self.pieces: list[tuple[int, int, int]] = []  # (shard, lo, hi) in the shard's range
        self._members: list[int] = []  # parameters per piece
        owner: dict[int, int] = {}
        for k in shards:
            a, b = shard_ranges[k]
            inside = sorted((lo, i) for i, (lo, hi) in spans.items() if a <= lo and hi <= b and hi > lo)
            target = max(1, (b - a) // max(1, pieces_per_shard))
            piece: list[int] = []
            size = 0
            for lo, i in reversed(inside):  # from the last layer, as backward goes
                piece.append(i)
                size += spans[i][1] - lo
                if size >= target or lo == inside[0][0]:
                    for j in piece:
                        owner[j] = len(self.pieces)
                    first = min(spans[j][0] for j in piece)  # the parameters of a piece are adjacent
                    self.pieces.append((k, first - a, first - a + size))
                    self._members.append(len(piece))
                    piece, size = [], 0
        self._remaining = list(self._members)
        self._armed = False
        self._ranges: dict[int, list[tuple[int, int]]] = {}  # shard -> ranges announced this backward
        self.error: BaseException | None = None  # an announcement that failed (the push raises it again)
        self._hooks: list[Any] = [params[i].register_post_accumulate_grad_hook(self._hook(owner[i]))
                                  for i in owner]

    def _hook(self, piece: int) -> Callable[[torch.Tensor], None]:
        def ready(_param: torch.Tensor) -> None:
            if not self._armed:
                return
            self._remaining[piece] -= 1
            if self._remaining[piece] == 0 and self.error is None:
                shard, lo, hi = self.pieces[piece]
                try:
                    self._announce(shard, lo, hi)
                except Exception as err:  # noqa: BLE001 - not raised through autograd; the push raises
                    self.error = err
                    return
                self._ranges.setdefault(shard, []).append((lo, hi))
        return ready

    def arm(self) -> None:
        """Before backward: every piece waits for its parameters."""
        self._remaining = list(self._members)
        self._ranges, self.error, self._armed = {}, None, True

    def finish(self) -> dict[int, int]:
        """After backward: elements announced per shard (pieces not announced go with the push)."""
        self._armed = False
        return {k: sum(hi - lo for lo, hi in ranges) for k, ranges in self._ranges.items()}

    def sent_ranges(self, shard: int) -> list[tuple[int, int]]:
        """The ranges of ``shard`` announced in the last backward."""
        return self._ranges.get(shard, [])

    def remove(self) -> None:
        """Remove the hooks (the layout changes)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
