"""Shared fixtures: an isolated cmdare home per test session, and one local Ray per module."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True, scope="session")
def _isolated_home(tmp_path_factory):
    """Keep tests away from the user's data directory and store."""
    home = tmp_path_factory.mktemp("cmdare-home")
    old = {k: os.environ.get(k) for k in ("CMDARE_HOME", "CMDARE_DB_URL")}
    os.environ["CMDARE_HOME"] = str(home)
    os.environ.pop("CMDARE_DB_URL", None)
    yield home
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def local_ray():
    """A single-node local Ray instance for one test module (Ray start costs seconds)."""
    import ray

    ray.init(address="local", num_cpus=6, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    yield ray
    ray.shutdown()
