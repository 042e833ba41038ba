"""The cluster config for one machine: cmdare's node types on Ray's fake multi-node provider.

``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE`` makes Ray's autoscaler start each
"node" of FILE as a set of Ray processes on this machine (``ray/autoscaler/_private/fake_multi_node``,
through :class:`~cmdare.cloud.local_node_provider.LocalNodeProvider`, which drops a dead node as a cloud does),
so the path of a cloud cluster (node types, custom resources, min/max workers, replacement of a dead
node) runs without a cloud. The provider runs no setup or start commands (``disable_node_updaters``):
nodes inherit the environment of the ``ray start --head`` that started the autoscaler, which is why the
start command exports ``CMDARE_STORAGE`` and ``RAY_AUTH_MODE``. Local nodes have no GPUs: workers offer
``cmdare_worker`` and ``cmdare_gpu_<gpu>`` but no ``GPU`` resource; each worker node is one worker.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from cmdare.cloud.detection import LOCAL_CLUSTER_RAY_CONFIG, system_config_flag
from cmdare.cloud.launcher_names import (
    GPU_LABEL,
    HEAD_RESOURCE,
    LOCAL_HEAD_TYPE,
    PS_RESOURCE,
    PS_TYPE,
    ROLE_LABEL,
    TRANSIENT_LABEL,
    WORKER_RESOURCE,
    gpu_resource,
    worker_type,
)
from cmdare.cloud.launcher_setup import AUTH_ENV, STORAGE_ENV

__all__ = ["LOCAL_OBJECT_STORE_BYTES", "LOCAL_PROVIDER", "is_local_config", "local_config", "local_start_command"]

#: Ray's fake multi-node provider, where a dead node is gone as on a cloud (the autoscaler imports it by path).
LOCAL_PROVIDER = "cmdare.cloud.local_node_provider.LocalNodeProvider"

#: Object store of each fake worker node (150 MiB, as in Ray's own fake-cluster tests).
LOCAL_OBJECT_STORE_BYTES = 150 * 1024 * 1024
DEFAULT_CONFIG_PATH = "cluster-local.yaml"


def local_config(
    groups: Sequence[tuple[str, int]],
    ps: int,
    transient: bool,
    storage: str | None,
    cpus_per_node: int,
    spare_nodes: int,
    head_port: int,
    cluster_name: str,
    config_path: str | None,
) -> dict[str, Any]:
    """The fake multi-node config: head ``ray.head.default``, ``cmdare_ps`` and one worker type per GPU type.

    Every non-head type has ``max_workers = min_workers + spare_nodes``: room for a replacement asked for
    before the provider has seen the dead node go (it looks when the autoscaler updates, every few seconds).
    ``head_start_ray_commands`` holds the command that starts it all (Ray's fake provider runs none itself);
    see :func:`local_start_command`.
    """
    common = {"CPU": cpus_per_node, "object_store_memory": LOCAL_OBJECT_STORE_BYTES}
    types: dict[str, Any] = {
        LOCAL_HEAD_TYPE: {"resources": {"CPU": cpus_per_node, HEAD_RESOURCE: 1}, "node_config": {}, "max_workers": 0},
        PS_TYPE: {
            "min_workers": ps, "max_workers": ps + spare_nodes,
            "resources": {**common, PS_RESOURCE: 1},
            "labels": {ROLE_LABEL: "ps"},
            "node_config": {},
        },
    }
    for gpu, count in groups:
        types[worker_type(gpu)] = {
            "min_workers": count, "max_workers": count + spare_nodes,
            "resources": {**common, WORKER_RESOURCE: 1, gpu_resource(gpu): 1},
            "labels": {ROLE_LABEL: "worker", GPU_LABEL: gpu, TRANSIENT_LABEL: str(transient).lower()},
            "node_config": {},
        }
    env = {"RAY_FAKE_CLUSTER": "1", **AUTH_ENV}
    if storage:
        env[STORAGE_ENV] = storage
    start = (" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
             + f" ray start --head --node-ip-address=127.0.0.1 --port={head_port} --num-cpus={cpus_per_node}"
             + f" --resources={shlex.quote(json.dumps({HEAD_RESOURCE: 1}))}"
             + " --dashboard-host=127.0.0.1"
             + f" --autoscaling-config={shlex.quote(config_path or DEFAULT_CONFIG_PATH)} "
             + system_config_flag(LOCAL_CLUSTER_RAY_CONFIG))
    return {
        "cluster_name": cluster_name,
        "max_workers": sum(t.get("max_workers", 0) for name, t in types.items() if name != LOCAL_HEAD_TYPE),
        "upscaling_speed": 10.0,
        "idle_timeout_minutes": 5,
        "provider": {
            "type": "external",
            "module": LOCAL_PROVIDER,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "launch_multiple": True,  # otherwise the provider starts one node per request, whatever the count
            "gcs_address": f"127.0.0.1:{head_port}",  # otherwise it assumes this machine's address and port 6379
        },
        "auth": {},
        "available_node_types": types,
        "head_node_type": LOCAL_HEAD_TYPE,
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [start],
        "worker_start_ray_commands": [],
    }


def is_local_config(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` is a local cluster's (cmdare's fake multi-node provider), not a cloud's."""
    return config.get("provider", {}).get("module") == LOCAL_PROVIDER


def local_start_command(config: Mapping[str, Any]) -> str:
    """The shell command line that starts the local cluster of ``config`` (``RAY_FAKE_CLUSTER=1 ... ray start
    --head ...``); run it with ``bash -c``. Stop the cluster with ``ray stop``."""
    if not is_local_config(config):
        raise ValueError("not a local (fake multi-node) cluster config")
    return str(config["head_start_ray_commands"][0])
