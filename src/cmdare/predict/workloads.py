"""Workload descriptors: the CNNs measured in the public CM-DARE data, and every other model by its profile.

One vocabulary: a name means the network ``cmdare workloads`` lists under it, in ``train``, ``plan`` and
``predict`` alike. The networks CM-DARE measured are the zoo's ``t2t_resnet15``/``t2t_resnet32``,
``custom_resnet1..8`` and ``shake_shake_*`` (:data:`ZOO_TO_PUBLISHED`); their features are the measured
ones (Tensor2Tensor's model FLOPs as in ``speed_data/0latency_data.csv``, #parameters, the checkpoint table's
#tensors and checkpoint size), and the data's own names (``Res32``, ``shakebig``, ...) name them too. Any
other model (``resnet32`` is He et al.'s 0.46M-parameter CIFAR ResNet, not T2T's 1.86M one) gets features
from cmdare's profiler (:func:`profiled_features`), whose training FLOPs follow the same convention (within
2% on the measured networks): a prediction for it extrapolates from the public data, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cmdare.errors import UnknownNameError
from cmdare.workloads.families import MEASURED_AS

__all__ = ["EXTRAPOLATED", "ZOO_TO_PUBLISHED", "WorkloadFeatures", "list_published_workloads", "profiled_features",
           "published_workload", "resolve_workload_name", "workload_features"]

SOURCE = "CM-DARE public data (Li, Walls, Guo, ICDCS 2020), Tensor2Tensor features"
EXTRAPOLATED = ("cmdare's profile of the model, not measured by CM-DARE: predictions extrapolate from the "
                "public data")


@dataclass(frozen=True)
class WorkloadFeatures:
    """Features of one CNN workload, as the performance models use them.

    Attributes:
        name: canonical name, as in the CM-DARE speed tables (``Res32``, ``shakebig`` ...).
        display_name: human name (as in the checkpoint table).
        model_flops: ``Model FLOPs`` of the speed tables (T2T's count for one training step).
        num_params: number of trainable parameters.
        num_tensors: number of variables (tensors) in the checkpoint.
        checkpoint_mb: checkpoint size in MB.
        max_tensor_mb: largest tensor in MiB where the data gives it, else None.
        source: where the figures come from.
    """

    name: str
    display_name: str
    model_flops: float
    num_params: int
    num_tensors: int
    checkpoint_mb: float
    max_tensor_mb: float | None = None
    source: str = SOURCE
    measured: bool = True  # CM-DARE measured this network; False: features from cmdare's profiler

    @property
    def avg_tensor_mb(self) -> float:
        """Mean float32 tensor size in MiB (matches the data's ``Average Tensor Size (MB)``)."""
        return self.num_params * 4 / self.num_tensors / 2**20

    @property
    def param_bytes(self) -> int:
        """Bytes of float32 parameters (what a worker pushes and pulls per step)."""
        return self.num_params * 4


def _w(
    name: str,
    display: str,
    flops: int,
    params: int,
    tensors: int,
    ckpt_mb: float,
    max_mb: float | None = None,
) -> WorkloadFeatures:
    return WorkloadFeatures(name, display, float(flops), params, tensors, ckpt_mb, max_mb)


_WORKLOADS: dict[str, WorkloadFeatures] = {
    w.name: w
    for w in (
        # name, display, Model FLOPs, #params, #tensors, checkpoint MB, max tensor MiB (where measured)
        _w("Res15", "ResNet-15", 630989589, 693818, 50, 6.27, 0.5625),
        _w("Res32", "ResNet-32", 1658696889, 1857722, 104, 15.99, 0.5625),
        _w("custom1", "Custom ResNet 1", 860117021, 1063226, 62, 9.26),
        _w("custom2", "Custom ResNet 2", 1087710757, 1211194, 74, 10.57),
        _w("custom3", "Custom ResNet 3", 1542543029, 1451706, 98, 12.78),
        _w("custom4", "Custom ResNet 4", 2343835089, 2633658, 140, 22.45),
        _w("custom5", "Custom ResNet 5", 2915531621, 3391034, 170, 28.7),
        _w("custom6", "Custom ResNet 6", 3943594121, 4610362, 224, 38.85),
        _w("custom7", "Custom ResNet 7", 4970946221, 5718842, 278, 48.15),
        _w("custom8", "Custom ResNet 8", 5882144461, 6421306, 326, 54.26),
        _w("shake16", "Shake 16", 663908170, 737418, 210, 9.57),
        _w("shakesmall", "Shake small", 2587431950, 2926986, 216, 26.39, 0.5625),
        _w("shake48", "Shake 48", 5768251646, 6568282, 216, 54.19),
        _w("shakemid", "Shake 64", 10208089582, 11661610, 216, 93.33),
        _w("shake80", "Shake 80", 15906945758, 18206970, 216, 143.01),
        _w("shakebig", "Shake Large", 22864820174, 26204362, 216, 204.04, 5.0625),
    )
}

# The zoo's name of each network the CM-DARE data measured.
ZOO_TO_PUBLISHED: dict[str, str] = dict(MEASURED_AS)

# The data's own spellings (never a zoo name of another network: ``resnet32`` is He's ResNet-32).
_ALIASES: dict[str, str] = {
    **ZOO_TO_PUBLISHED,
    "res15": "Res15",
    "res32": "Res32",
    "shake_small": "shakesmall",
    "shake-small": "shakesmall",
    "shakeshake-small": "shakesmall",
    "shake32": "shakesmall",
    "shake64": "shakemid",
    "shake_mid": "shakemid",
    "shake_big": "shakebig",
    "shake-big": "shakebig",
    "shakelarge": "shakebig",
    "shake96": "shakebig",
    "shakeshake-big": "shakebig",
    **{f"custom-resnet{i}": f"custom{i}" for i in range(1, 9)},
}


def resolve_workload_name(name: str) -> str:
    """Canonical published-workload name for ``name`` (case-insensitive, aliases allowed).

    Raises:
        UnknownNameError: if the name is neither a workload nor an alias.
    """
    key = name.strip()
    lower = {k.lower(): k for k in _WORKLOADS}
    lower_display = {w.display_name.lower(): k for k, w in _WORKLOADS.items()
                     if not w.display_name.startswith("ResNet-")}  # He's ResNets share these names
    low = key.lower()
    for table in (lower, _ALIASES, lower_display):
        if low in table:
            return table[low]
    raise UnknownNameError("published workload", name, list_published_workloads())


def published_workload(name: str) -> WorkloadFeatures:
    """Features of the published CNN ``name`` (e.g. ``t2t_resnet32`` or ``Res32``).

    Raises:
        UnknownNameError: if the name is unknown; the message lists valid names.
    """
    return _WORKLOADS[resolve_workload_name(name)]


def list_published_workloads() -> list[str]:
    """Canonical names of all published workloads, in table order."""
    return list(_WORKLOADS)


def workload_features(name: str | WorkloadFeatures, input_shape: tuple[int, ...] | None = None) -> WorkloadFeatures:
    """The features of the network ``name`` names: measured (:func:`published_workload`) where CM-DARE
    measured it, else from cmdare's profiler (:func:`profiled_features`, ``measured`` False). ``input_shape``:
    one sample's shape, for your own model (default CIFAR's 3x32x32, where CM-DARE measured).

    Raises:
        UnknownNameError: neither a model (``cmdare workloads``) nor a published name.
    """
    if isinstance(name, WorkloadFeatures):
        return name
    if input_shape is not None and tuple(input_shape) != CIFAR_SHAPE:
        from cmdare.workloads.registry import check_model_name

        check_model_name(name)
        return profiled_features(name, tuple(input_shape))
    try:
        return published_workload(name)
    except UnknownNameError:
        pass
    from cmdare.workloads.registry import check_model_name, model_names

    try:
        check_model_name(name)
    except UnknownNameError:
        raise UnknownNameError("workload", name, [*model_names(), *list_published_workloads()]) from None
    return profiled_features(name)


CIFAR_SHAPE = (3, 32, 32)


@lru_cache(maxsize=64)
def profiled_features(name: str, input_shape: tuple[int, ...] = CIFAR_SHAPE) -> WorkloadFeatures:
    """Features of model ``name`` from cmdare's profiler at ``input_shape`` (CIFAR's 3x32x32 by default):
    training FLOPs per sample (T2T's convention), parameters, tensors, and a checkpoint of parameters and
    momentum (float32), as the measured networks' checkpoints hold."""
    from cmdare.workloads.profile import profile_model

    return profile_features(name, profile_model(name, input_shape))


def module_features(name: str, module: Any, input_shape: tuple[int, ...], sample: Any = None) -> WorkloadFeatures:
    """Features of a built ``module`` (your model, as a run builds it) at one sample's ``input_shape``; with
    ``sample`` (a batch of one sample of its data), profiled on that dtype, or on that sample where the meta
    trace fails (:func:`cmdare.workloads.profile_model`).

    Raises:
        ProfileError: no forward pass of the model could be counted.
    """
    from cmdare.workloads.profile import profile_model

    return profile_features(name, profile_model(module, input_shape, sample=sample))


def profile_features(name: str, p: Any) -> WorkloadFeatures:
    """The features of a :class:`~cmdare.workloads.WorkloadProfile`, as the performance models use them."""
    checkpoint_mb = 2 * 4 * p.num_params / 1e6  # parameters and momentum, float32; to 10 kB as published, a tiny
    checkpoint_mb = round(checkpoint_mb, 2) if checkpoint_mb >= 0.01 else checkpoint_mb  # model's kept exact
    return WorkloadFeatures(name, name, float(p.flops_per_sample_train), p.num_params, p.num_tensors,
                            checkpoint_mb, p.max_tensor_mb, EXTRAPOLATED, measured=False)
