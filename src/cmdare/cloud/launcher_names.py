"""Names shared by the cluster configs and the trainer: node types, custom resources and node labels.

The trainer places parameter shards with :data:`PS_RESOURCE`, any training worker with
:data:`WORKER_RESOURCE` and a worker of one GPU type with :func:`gpu_resource` (``cmdare_gpu_k80``);
the head offers :data:`HEAD_RESOURCE`, so ``cmdare train --address`` knows a cmdare cluster before its
other nodes are up.
"""

from __future__ import annotations

from cmdare.cloud.servers import GPU_RESOURCE_PREFIX, HEAD_RESOURCE, PS_RESOURCE, WORKER_RESOURCE, gpu_resource

__all__ = [
    "GPU_LABEL",
    "GPU_RESOURCE_PREFIX",
    "HEAD_RESOURCE",
    "HEAD_TYPE",
    "LOCAL_HEAD_TYPE",
    "PS_RESOURCE",
    "PS_TYPE",
    "ROLE_LABEL",
    "TRANSIENT_LABEL",
    "WORKER_RESOURCE",
    "WORKER_TYPE_PREFIX",
    "gpu_resource",
    "worker_type",
]

HEAD_TYPE = "cmdare_head"
#: The head node type of Ray's fake multi-node provider: the provider hard-codes this name.
LOCAL_HEAD_TYPE = "ray.head.default"
PS_TYPE = "cmdare_ps"
WORKER_TYPE_PREFIX = "cmdare_worker_"

ROLE_LABEL = "cmdare-role"
GPU_LABEL = "cmdare-gpu"
TRANSIENT_LABEL = "cmdare-transient"


def worker_type(gpu: str) -> str:
    """The node type of the worker servers with GPU type ``gpu``: ``cmdare_worker_<gpu lower>``."""
    return WORKER_TYPE_PREFIX + str(gpu).strip().lower()
