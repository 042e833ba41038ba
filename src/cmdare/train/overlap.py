"""Communication overlapped with backward: pieces of a shard's gradient leave as backward produces them.

Backward computes gradients from the last layer to the first. Each shard's range of the flat gradient is
cut, at parameter boundaries, into pieces of about equal size; a hook on every parameter
(``register_post_accumulate_grad_hook``) counts the piece's parameters done, and the moment a piece is
complete it is announced to its shard, which carries it over its link while backward goes on (as
BytePS and Poseidon push layer by layer). The push after backward then carries only the pieces not yet
sent. The shard applies the update once, when the push comes, so training is unchanged.

Pieces are announced on same-node channels (:mod:`cmdare.ps.channel`), where the gradient already lies
in shared memory and the emulated link (``--ps-bandwidth``) is what takes time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Pieces each shard's range is cut into (fewer when it holds fewer parameters).
PIECES_PER_SHARD = 4


class GradientPieces:
    """The pieces of shards ``shards`` (placement indices) of a layout, and the hooks that announce them.

    ``announce(shard, nbytes)`` is called from backward when a piece is complete. :meth:`arm` before
    backward, :meth:`finish` after it: the bytes announced per shard.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], spans: dict[int, tuple[int, int]],
                 shard_ranges: Sequence[tuple[int, int]], shards: Sequence[int],
                 announce: Callable[[int, int], None], pieces_per_shard: int = PIECES_PER_SHARD):
        self._announce = announce
        self.pieces: list[tuple[int, int]] = []  # (shard, bytes)
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
                    self.pieces.append((k, 4 * size))
                    self._members.append(len(piece))
                    piece, size = [], 0
        self._remaining = list(self._members)
        self._armed = False
        self._sent: dict[int, int] = {}
        self.error: BaseException | None = None  # an announcement that failed (the push raises it again)
        self._hooks: list[Any] = [params[i].register_post_accumulate_grad_hook(self._hook(owner[i]))
                                  for i in owner]

    def _hook(self, piece: int) -> Callable[[torch.Tensor], None]:
        def ready(_param: torch.Tensor) -> None:
            if not self._armed:
                return
            self._remaining[piece] -= 1
            if self._remaining[piece] == 0 and self.error is None:
                shard, nbytes = self.pieces[piece]
                try:
                    self._announce(shard, nbytes)
                except Exception as err:  # noqa: BLE001 - not raised through autograd; the push raises
                    self.error = err
                    return
                self._sent[shard] = self._sent.get(shard, 0) + nbytes
        return ready

    def arm(self) -> None:
        """Before backward: every piece waits for its parameters."""
        self._remaining = list(self._members)
        self._sent, self.error, self._armed = {}, None, True

    def finish(self) -> dict[int, int]:
        """After backward: bytes announced per shard (pieces not announced go with the push)."""
        self._armed = False
        return self._sent

    def remove(self) -> None:
        """Remove the hooks (the layout changes)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
