"""One member's view of an elastic group: formed at an epoch, collectives within a deadline, a lost peer raised.

A group of ``size`` members is formed at ``epoch`` through the driver's :class:`~cmdare.collective.Rendezvous`
(keys under ``epoch/<n>/``), waiting up to ``form_timeout_s`` for every member. Every collective ends within
``deadline_s``: a peer that died closes its
connections and the collective fails at once; a peer that froze (``kill -STOP``, a half-open connection) is
waited for until the deadline. Either way the member gets :class:`PeerLost`, abandons the group and waits to be
told the next epoch, its rank and the new size (:meth:`ElasticGroup.form`). A group of one runs no collective.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

__all__ = ["ElasticGroup", "PeerLost"]


class PeerLost(RuntimeError):
    """A collective or the group's formation failed: a peer died, froze or never came (``epoch``: the group's)."""

    def __init__(self, epoch: int, detail: str):
        super().__init__(f"group epoch {epoch}: a peer was lost ({detail})")
        self.epoch, self.detail = epoch, detail


class ElasticGroup:
    """Member ``rank`` of ``size`` of the group at ``epoch``, re-formed on every membership change.

    Args:
        address: the rendezvous store's ``(host, port)``.
        bind_host: the address this member's collective connections listen on (its node's address).
        deadline_s: the most a collective may take before its peers count as lost.
        form_timeout_s: the most a formation may wait for every member to join (members told at slightly
            different times: a loaded machine, a newcomer's first call).
    """

    def __init__(self, address: tuple[str, int], bind_host: str = "127.0.0.1", deadline_s: float = 5.0,
                 form_timeout_s: float = 30.0):
        import torch.distributed as dist

        self.address, self.bind_host, self.deadline_s = (str(address[0]), int(address[1])), bind_host, deadline_s
        self.form_timeout_s = form_timeout_s
        self._store = dist.TCPStore(self.address[0], self.address[1], is_master=False,
                                    timeout=timedelta(seconds=max(deadline_s, 30.0)))
        self._pg: Any = None
        self.epoch, self.rank, self.size = -1, 0, 1

    def form(self, epoch: int, rank: int, size: int) -> None:
        """Abandon the current group and form the one of ``epoch`` as member ``rank`` of ``size``.

        Raises:
            PeerLost: a member did not come within the deadline.
        """
        import torch.distributed as dist

        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a group of {size}")
        self.abandon()
        self.epoch, self.rank, self.size = epoch, rank, size
        if size == 1:
            return
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=max(self.deadline_s, self.form_timeout_s))
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.bind_host)]
        try:
            self._pg = dist.ProcessGroupGloo(dist.PrefixStore(f"epoch/{epoch}/", self._store), rank, size, options)
        except RuntimeError as err:
            raise PeerLost(epoch, _first_line(err)) from None
        self._pg.set_timeout(timedelta(seconds=self.deadline_s))  # formed: every collective within the deadline

    def abandon(self) -> None:
        """Leave the current group: its connections close, so a peer still waiting in it fails at once.

        Dropping the group is what closes them (gloo's ``abort()`` and ``shutdown()`` leave a waiting peer waiting
        until its deadline); a caller holding a started collective's work must drop it too.
        """
        self._pg = None

    def allreduce(self, tensor: torch.Tensor) -> Any:
        """Start summing ``tensor`` in place over the group; returns the work to :meth:`wait` (None in a group
        of one).

        Raises:
            PeerLost: the group is broken already (a member never trains alone on in a group it left).
        """
        if self._pg is None:
            if self.size > 1:
                raise PeerLost(self.epoch, "the group was left after a loss: it must be formed again")
            return None
        try:
            return self._pg.allreduce([tensor])
        except RuntimeError as err:
            raise self._lost(err) from None

    def wait(self, works: Sequence[Any]) -> None:
        """Wait for started collectives (each bounded by the deadline).

        Raises:
            PeerLost: a collective failed or ran past the deadline.
        """
        try:
            for work in works:
                if work is not None:
                    work.wait()
        except RuntimeError as err:
            raise self._lost(err) from None

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """Copy member ``root``'s ``tensor`` into every member's, in place.

        Raises:
            PeerLost: a member was lost meanwhile.
        """
        if self._pg is None:
            if self.size > 1:
                raise PeerLost(self.epoch, "the group was left after a loss: it must be formed again")
            return
        try:
            work = self._pg.broadcast(tensor, root)
        except RuntimeError as err:
            raise self._lost(err) from None
        self.wait([work])

    def _lost(self, err: BaseException) -> PeerLost:
        """A collective failed: leave the group at once, so that a peer waiting on this member fails now rather
        than at the deadline (a loss spreads through the group in one round trip)."""
        lost = PeerLost(self.epoch, _first_line(err))
        self.abandon()
        return lost


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
