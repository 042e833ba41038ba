"""The rendezvous store listens on the one address it is given, and a group refuses a rank outside its size."""

from __future__ import annotations

import socket

import pytest

from cmdare.collective import ElasticGroup, Rendezvous


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp, IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, _remote, state = line.split()[1:4]
            host, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.add(host)
    return found


def test_the_store_listens_on_loopback_only_and_members_reach_it():
    rendezvous = Rendezvous("127.0.0.1")
    try:
        assert _listening_addresses(rendezvous.port) == {"0100007F"}  # 127.0.0.1, nothing on every interface
        group = ElasticGroup(rendezvous.address)
        group.form(0, 0, 1)  # a group of one runs no collective
        assert (group.epoch, group.rank, group.size) == (0, 0, 1)
        with socket.create_connection(rendezvous.address, timeout=5):
            pass
    finally:
        rendezvous.close()


def test_a_rank_outside_the_group_is_refused():
    rendezvous = Rendezvous()
    try:
        with pytest.raises(ValueError, match="rank 3 is not in a group of 2"):
            ElasticGroup(rendezvous.address).form(1, 3, 2)
    finally:
        rendezvous.close()
