"""Fixtures of the multi-node tests: a loopback-only network namespace, and a Ray cluster started inside one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from netns_cluster import NetnsCluster, netns_available


@pytest.fixture(scope="session")
def _netns_ok() -> None:
    """Skip when this machine does not let us make network namespaces."""
    reason = netns_available()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def netns(_netns_ok: None, tmp_path: Path) -> Iterator[NetnsCluster]:
    """A started namespace (loopback only), no Ray inside yet; killed with everything in it at the end."""
    with NetnsCluster(tmp_path) as ns:
        yield ns.start_namespace()


@pytest.fixture
def netns_cluster(netns: NetnsCluster) -> Callable[..., NetnsCluster]:
    """``netns_cluster(workers=K, head_cpus=3, env=...)``: start a head + K worker nodes in :func:`netns`."""
    return netns.start_cluster
