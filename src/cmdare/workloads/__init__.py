"""cmdare.workloads: the CNN zoo (ResNet-CIFAR, Tensor2Tensor/CM-DARE ResNets, Shake-Shake) and its profiler.

    >>> from cmdare.workloads import build_model, profile_model
    >>> model = build_model("resnet32", num_classes=10, in_channels=3)
    >>> profile_model("resnet32").num_params
    464154

See :mod:`cmdare.workloads.resnet` and :mod:`cmdare.workloads.shake_shake` for each family's exact
depth and width, and :mod:`cmdare.workloads.profile` for what the FLOP counts include.
"""

from __future__ import annotations

from cmdare.workloads.profile import WorkloadProfile, count_flops_forward, profile_model
from cmdare.workloads.registry import (
    ModelSpec,
    build_model,
    describe_model,
    list_models,
    register_model,
    unregister_model,
)
from cmdare.workloads.zoo import register_builtin_models

register_builtin_models()

__all__ = [
    "ModelSpec",
    "WorkloadProfile",
    "build_model",
    "count_flops_forward",
    "describe_model",
    "list_models",
    "profile_model",
    "register_model",
    "unregister_model",
]
