"""A worker's channels to its shards: the same-node one (shared memory) and the TCP one (another node).

Ray carries the control only: each shard's node and channel address (and the channel's secret). A shard on the
worker's node is reached through :class:`~cmdare.ps.channel.ChannelClient` (the worker's host buffers live in
the shared memory it hands over); one on another node through :class:`~cmdare.ps.tcp_channel.TcpChannelClient`
(gradient and parameters stream between the worker's host buffers and the shard). A channel that cannot be
opened leaves its shard to Ray's calls, with the reason logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cmdare.ps.channel import ChannelAddress, ChannelClient, SharedHostMemory
from cmdare.ps.layout import FlatLayout
from cmdare.ps.tcp_channel import TcpChannelClient, tcp_channels_enabled

__all__ = ["TCP_CONNECT_S", "open_channels"]

log = logging.getLogger(__name__)

TCP_CONNECT_S = 10.0  # a shard's TCP channel not connected and authenticated in time is reached through Ray

Clients = dict[int, ChannelClient | TcpChannelClient]


def open_channels(shards: Sequence[Any], live: list[int], layout: FlatLayout, node_id: str | None,
                  memory: SharedHostMemory | None) -> tuple[Clients, set[int]]:
    """Channels to the ``live`` shards (placement indices) a worker on node ``node_id`` can open: same-node ones
    when it has shared ``memory``, TCP ones to other nodes unless ``CMDARE_TCP=0``. Returns the clients and
    the shards among them on the worker's own node. ``memory``'s descriptor is closed (the shards hold theirs)."""
    clients: Clients = {}
    same_node: set[int] = set()
    nodes = _shard_nodes(shards, live) if node_id else {}
    if memory is not None:
        for k, (node, address) in nodes.items():
            if address is not None and node == node_id:
                a, b = layout.shard_ranges[k]
                try:
                    clients[k] = ChannelClient(address, memory, a, b - a)
                    same_node.add(k)
                except OSError as err:  # e.g. another network namespace: reached through Ray
                    log.warning("shard %d's channel refused or unreachable (%s): pushes go through Ray", k, err)
        memory.close()
    if tcp_channels_enabled():
        remote = [k for k, (node, _) in nodes.items() if node is not None and node != node_id]
        clients.update(_open_tcp(shards, remote, layout))
    return clients, same_node


def _shard_nodes(shards: Sequence[Any], live: list[int]) -> dict[int, tuple[str | None, ChannelAddress | None]]:
    """Each live shard's Ray node and same-node channel address (None, None for a shard that is gone)."""
    import ray

    try:
        replies = ray.get([shards[k].channel.remote() for k in live])
    except ray.exceptions.RayError:  # a shard is gone (it is being replaced): every push goes through Ray
        replies = [(None, None)] * len(live)
    return dict(zip(live, replies, strict=True))


def _open_tcp(shards: Sequence[Any], remote: list[int], layout: FlatLayout) -> Clients:
    """TCP channels to the shards ``remote`` on other nodes."""
    import ray

    try:
        addresses = ray.get([shards[k].tcp_channel.remote() for k in remote])
    except ray.exceptions.RayError:  # a shard is gone: Ray reports it on the first push
        return {}
    clients: Clients = {}
    for k, address in zip(remote, addresses, strict=True):
        if address is None:
            continue
        a, b = layout.shard_ranges[k]
        try:
            clients[k] = TcpChannelClient(address, layout.host_params_np[a:b], layout.host_grads_np[a:b],
                                          timeout=TCP_CONNECT_S)
        except OSError as err:  # no route, a firewall, a refused handshake: Ray still reaches it
            log.warning("shard %d's TCP channel at %s:%d refused or unreachable (%s): pushes go through Ray",
                        k, address.host, address.port, err)
    return clients
