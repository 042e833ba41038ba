"""Real object-store servers on 127.0.0.1 for the storage tests: moto's S3 server and a GCS emulator.

Each is a real HTTP server speaking its cloud's protocol (the servers s3fs's and gcsfs's users test
against); the environment points the client libraries at it, as a user's would point at MinIO or a
bucket: ``AWS_ENDPOINT_URL`` for S3, ``STORAGE_EMULATOR_HOST`` for GCS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class ObjectStore:
    """A running store: its URL prefix for cmdare and the environment its clients need."""

    url: str
    env: dict[str, str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def s3_server(bucket: str = "cmdare-test") -> Iterator[ObjectStore]:
    """moto's standalone S3 server on 127.0.0.1 with ``bucket`` created."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    try:
        with _env(env):
            import boto3

            boto3.client("s3").create_bucket(Bucket=bucket)
            yield ObjectStore(f"s3://{bucket}", env)
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_server(bucket: str = "cmdare-test") -> Iterator[ObjectStore]:
    """The gcp-storage-emulator (in memory) on 127.0.0.1 with ``bucket`` created."""
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    # gcsfs's experimental layer asks a gRPC control API the emulator does not serve: use plain gcsfs.
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    try:
        with _env(env):
            yield ObjectStore(f"gs://{bucket}", env)
    finally:
        server.stop()
