"""Named workload descriptors of the CNNs measured in the public CM-DARE data.

The features are Tensor2Tensor's (model FLOPs as in ``speed_data/0latency_data.csv``, #parameters)
and the checkpoint table's #tensors and checkpoint size. They belong to the measurements they came
with: never combine them with cmdare's own zoo profiler figures (``cmdare.workloads``), whose FLOP
counts use another convention. ``resnet32`` here means "T2T ResNet-32 as measured by CM-DARE".
"""

from __future__ import annotations

from dataclasses import dataclass

from cmdare.errors import UnknownNameError

__all__ = ["WorkloadFeatures", "list_published_workloads", "published_workload", "resolve_workload_name"]

SOURCE = "CM-DARE public data (Li, Walls, Guo, ICDCS 2020), Tensor2Tensor features"


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

_ALIASES: dict[str, str] = {
    "resnet15": "Res15",
    "resnet-15": "Res15",
    "resnet_15": "Res15",
    "res15": "Res15",
    "resnet32": "Res32",
    "resnet-32": "Res32",
    "resnet_32": "Res32",
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
    **{f"custom_resnet{i}": f"custom{i}" for i in range(1, 9)},
}


def resolve_workload_name(name: str) -> str:
    """Canonical published-workload name for ``name`` (case-insensitive, aliases allowed).

    Raises:
        UnknownNameError: if the name is neither a workload nor an alias.
    """
    key = name.strip()
    lower = {k.lower(): k for k in _WORKLOADS}
    lower_display = {w.display_name.lower(): k for k, w in _WORKLOADS.items()}
    low = key.lower()
    for table in (lower, _ALIASES, lower_display):
        if low in table:
            return table[low]
    raise UnknownNameError("published workload", name, list_published_workloads())


def published_workload(name: str) -> WorkloadFeatures:
    """Features of the published CNN ``name`` (e.g. ``resnet32`` -> ``Res32``).

    Raises:
        UnknownNameError: if the name is unknown; the message lists valid names.
    """
    return _WORKLOADS[resolve_workload_name(name)]


def list_published_workloads() -> list[str]:
    """Canonical names of all published workloads, in table order."""
    return list(_WORKLOADS)
