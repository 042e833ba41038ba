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

import importlib
from typing import Any

# Loaded on first use, so that importing the package (e.g. for the CLI's ``cmdare --help``) does not
# import torch; the registry registers the built-in zoo the first time it is consulted.
_EXPORTS = {
    "WorkloadProfile": "cmdare.workloads.profile",
    "count_flops_forward": "cmdare.workloads.profile",
    "profile_model": "cmdare.workloads.profile",
    "ModelSpec": "cmdare.workloads.registry",
    "build_model": "cmdare.workloads.registry",
    "describe_model": "cmdare.workloads.registry",
    "list_models": "cmdare.workloads.registry",
    "register_model": "cmdare.workloads.registry",
    "unregister_model": "cmdare.workloads.registry",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cmdare.workloads' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
