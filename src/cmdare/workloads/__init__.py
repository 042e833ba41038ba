"""cmdare.workloads: the CNN zoo in plain ``torch.nn`` and its profiler.

    >>> from cmdare.workloads import build_model, profile_model
    >>> model = build_model("resnet32", num_classes=10, in_channels=3)
    >>> profile_model("resnet32").num_params
    464154

Families (``cmdare workloads`` lists every name with its figures):

=====================================  ==========================================================
``resnet8/15/20/32/56``                He et al. 2016 CIFAR ResNets, 16/32/64 channels, 6n+2 layers
                                       (``resnet15`` = n=2, T2T's name); ``resnet8`` is for tests
``t2t_resnet15/32``,                   Tensor2Tensor's ``resnet_cifar_*`` as measured by CM-DARE:
``custom_resnet1..8``                  same parameter and tensor counts as the data, FLOPs within 2%
``custom_resnet9/10``                  the same at 64/128/256 channels (our width extension)
``shake_shake_{16,32,48,64,80,96}``    Shake-Shake-26 2x{w}d; ``_small``/``_mid``/``_large`` are
                                       32/64/96, as in the CM-DARE data (shakesmall/shakemid/shakebig)
=====================================  ==========================================================

The CM-DARE data's "ResNet-32" is ``t2t_resnet32`` (1.86M parameters), not He's ``resnet32`` (0.46M).
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
