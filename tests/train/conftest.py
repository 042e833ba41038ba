"""Fixtures of the training tests: one local multi-node Ray cluster per test module."""

from __future__ import annotations

import pytest

from cmdare.cloud.detection import LOCAL_FAILURE_DETECTION
from cmdare.train.run.ray_session import start_local_cluster


@pytest.fixture(scope="module")
def cluster():
    """A ``ray.cluster_utils.Cluster`` on 127.0.0.1: a 3-CPU head holding the ``cmdare_ps`` resource, Ray's
    failure detection shortened; worker nodes are added by ``LocalClusterProvider``."""
    import ray

    c = start_local_cluster(num_cpus=3, resources={"cmdare_ps": 100}, _system_config=LOCAL_FAILURE_DETECTION)
    yield c
    ray.shutdown()
    c.shutdown()
