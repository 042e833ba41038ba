"""The store the members of an elastic group meet through: a ``torch.distributed`` TCP store the driver hosts.

It listens on one address (the driver's node address; 127.0.0.1 on one machine), never on every interface: the
socket is bound here and handed to the store. It outlives every group: each re-formation uses a key prefix of
its own (the group's epoch), so a group abandoned after a loss never meets the next one's keys.
"""

from __future__ import annotations

import socket
from datetime import timedelta

__all__ = ["Rendezvous"]


class Rendezvous:
    """A TCP store listening on ``host`` (a free port), for the members' :class:`~cmdare.collective.ElasticGroup`."""

    def __init__(self, host: str = "127.0.0.1", timeout_s: float = 60.0):
        import torch.distributed as dist

        self._socket: socket.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((host, 0))
        self._socket.listen(256)
        self.host, self.port = host, int(self._socket.getsockname()[1])
        self.store = dist.TCPStore(host, self.port, is_master=True, master_listen_fd=self._socket.fileno(),
                                   wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
        self._socket.detach()  # the store owns the listening socket now and closes it

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` members connect to."""
        return self.host, self.port

    def close(self) -> None:
        """Stop listening (members still in a group keep their own connections to each other)."""
        self.store = None
