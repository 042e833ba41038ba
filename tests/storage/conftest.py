"""Fixtures: one S3 server and one GCS emulator per test session; a storage URL per backend."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Before gcsfs is first imported (it reads this at import): the emulator has no gRPC control plane.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from object_stores import gcs_server, s3_server  # noqa: E402


@pytest.fixture(scope="session")
def s3():
    with s3_server() as store:
        yield store


@pytest.fixture(scope="session")
def gcs():
    with gcs_server() as store:
        yield store


@pytest.fixture(params=["local", "s3", "gcs"])
def storage_url(request, tmp_path):
    """A fresh, empty location on each backend."""
    name = request.node.name.replace("[", "-").replace("]", "")
    if request.param == "local":
        return str(tmp_path / "storage")
    store = request.getfixturevalue(request.param)
    return f"{store.url}/{name}"
