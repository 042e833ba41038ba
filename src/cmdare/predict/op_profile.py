"""Per-operator FLOPs and DRAM bytes of one training step, and the roofline split of that work.

The profiler runs a model's forward and backward pass on PyTorch's ``meta`` device (no arithmetic)
under a dispatch mode that sees every ATen operator: FLOPs from ``torch.utils.flop_counter``'s
formulas, bytes = every input and output tensor of the operator (what it reads and writes from DRAM;
views are free). A GPU with peak ``P`` FLOP/s and bandwidth ``B`` bytes/s runs an operator
compute-bound when its intensity ``FLOPs / bytes >= P / B`` (the roofline's ridge), else
memory-bound: :func:`roofline_split` sums the FLOPs of the first kind and the bytes of the second.

The profiles of the 16 published CNNs (cmdare's zoo builds them with the same #parameters and
#tensors as the CM-DARE data; batch 128, CIFAR-10 shape) ship as ``op_profiles.json``, written by
``python -m cmdare.predict.op_profile``, so predicting never imports torch.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = [
    "PROFILE_BATCH",
    "ZOO_NAMES",
    "OP_KINDS",
    "OpProfile",
    "op_profile_for",
    "profile_model_ops",
    "extra_op_profiles",
    "published_op_profiles",
    "roofline_split",
    "tensor_list_for",
]

PROFILE_BATCH = 128  # Tensor2Tensor's CIFAR batch size
_FILE = Path(__file__).with_name("op_profiles.json")
# published workload name -> cmdare zoo model of the same architecture
ZOO_NAMES = {
    "Res15": "t2t_resnet15",
    "Res32": "t2t_resnet32",
    **{f"custom{i}": f"custom_resnet{i}" for i in range(1, 9)},
    "shake16": "shake_shake_16",
    "shakesmall": "shake_shake_32",
    "shake48": "shake_shake_48",
    "shakemid": "shake_shake_64",
    "shake80": "shake_shake_80",
    "shakebig": "shake_shake_96",
}
_FREE = {
    "aten.detach", "aten.view", "aten._unsafe_view", "aten.expand", "aten.t", "aten.transpose",
    "aten.permute", "aten.reshape", "aten.alias", "aten.as_strided", "aten.slice", "aten.select",
    "aten.unsqueeze", "aten.squeeze", "aten.empty", "aten.empty_like", "aten.empty_strided",
}


#: Operator kinds of a profile's fourth column: convolutions (TF32 tensor cores by default from Ampere on),
#: other FLOP-counted operators (matrix products, attention: FP32 by default) and the rest (elementwise,
#: normalisation, pooling, copies: DRAM-bound).
OP_KINDS = ("memory", "conv", "matmul")
_CONV_OPS = {"aten.convolution", "aten._convolution", "aten.convolution_backward", "aten.cudnn_convolution",
             "aten.conv2d", "aten.conv1d", "aten.conv3d"}


class OpProfile:
    """Operators of one training step as rows ``(flops, bytes, count, kind)``, plus the parameter list.

    Attributes:
        ops: array of shape (n, 4); ``kind`` indexes :data:`OP_KINDS` (a 3-column array reads as conv for an
            operator with FLOPs, memory otherwise).
        params: ``[(name, shape), ...]`` of the trainable tensors, in model order.
        batch: the batch size profiled.
    """

    def __init__(self, ops: np.ndarray, params: list[tuple[str, tuple[int, ...]]], batch: int):
        ops = np.asarray(ops, dtype=float)
        ops = ops.reshape(-1, ops.shape[-1] if ops.size else 4)
        if ops.shape[1] == 3:
            ops = np.column_stack([ops, (ops[:, 0] > 0).astype(float)])
        self.ops = ops
        self.params = [(str(n), tuple(int(d) for d in s)) for n, s in params]
        self.batch = int(batch)

    @property
    def flops(self) -> float:
        """FLOPs of the whole step."""
        return float(self.ops[:, 0] @ self.ops[:, 2])

    @property
    def param_count(self) -> int:
        """Trainable parameters of the profiled model (the sum over :attr:`params`)."""
        return int(sum(int(np.prod(shape)) for _, shape in self.params))

    @property
    def bytes(self) -> float:
        """DRAM bytes of the whole step."""
        return float(self.ops[:, 1] @ self.ops[:, 2])

    def scaled(self, factor: float) -> OpProfile:
        """The same operator mix with every FLOP and byte times ``factor``."""
        ops = self.ops.copy()
        ops[:, :2] *= factor
        return OpProfile(ops, self.params, self.batch)


def roofline_split(profile: OpProfile, peak_flops: float, bandwidth: float) -> tuple[float, float]:
    """``(FLOPs of compute-bound operators, bytes of memory-bound operators)`` at ridge ``P / B``."""
    f, b, n = profile.ops[:, :3].T
    ridge = peak_flops / bandwidth
    compute = (b <= 0) | (f >= ridge * b)
    return float((f * n)[compute].sum()), float((b * n)[~compute].sum())


#: Zoo models profiled beside the published CNNs (Gavel's measured networks), at the batch sizes Gavel measured:
#: ``name -> (input shape, classes)``.
EXTRA_PROFILES = {"resnet18": ((3, 32, 32), 10), "resnet50": ((3, 224, 224), 1000)}
EXTRA_BATCHES = (16, 32, 64, 128, 256)


def profile_model_ops(name: str, batch: int = PROFILE_BATCH, input_shape=(3, 32, 32), num_classes: int = 10):
    """Profile zoo model ``name`` (one SGD step: forward, cross-entropy, backward) on ``meta``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    from cmdare.workloads.registry import build_model

    counts: Counter = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func.overloadpacket
            if str(packet) in _FREE:
                return out
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
            kind = 0 if not flops else 1 if str(packet) in _CONV_OPS else 2
            counts[(int(flops), int(nbytes), kind)] += 1
            return out

    with torch.device("meta"):
        model = build_model(name, num_classes=num_classes, in_channels=input_shape[0])
    model.train()
    x = torch.empty((batch, *input_shape), device="meta")
    y = torch.zeros((batch,), dtype=torch.long, device="meta")
    with _Count():
        torch.nn.functional.cross_entropy(model(x), y).backward()
    ops = np.array([[f, b, c, k] for (f, b, k), c in sorted(counts.items())], dtype=float)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    return OpProfile(ops, params, batch)


@lru_cache(maxsize=1)
def published_op_profiles() -> dict[str, OpProfile]:
    """The shipped profiles of the published CNNs, by published workload name."""
    raw = _raw()
    return {k: OpProfile(np.array(v["ops"]), [(n, tuple(s)) for n, s in v["params"]], raw["batch"])
            for k, v in raw["profiles"].items()}


@lru_cache(maxsize=1)
def _raw() -> dict:
    return json.loads(_FILE.read_text())


@lru_cache(maxsize=1)
def extra_op_profiles() -> dict[tuple[str, int], OpProfile]:
    """The shipped profiles of :data:`EXTRA_PROFILES`, by ``(zoo name, batch)``."""
    out = {}
    for name, entry in _raw().get("extra", {}).items():
        params = [(n, tuple(s)) for n, s in entry["params"]]
        for batch, ops in entry["ops_by_batch"].items():
            out[(name, int(batch))] = OpProfile(np.array(ops), params, int(batch))
    return out


@lru_cache(maxsize=4096)
def op_profile_for(model_flops: float, num_params: float, num_tensors: float) -> OpProfile:
    """The profile of a workload given by its data features: the published CNN on an exact
    (FLOPs, #parameters) match, else the published CNN nearest in (log FLOPs, log #tensors) with
    its FLOPs and bytes scaled to ``model_flops`` and equal-size tensors (``num_params / num_tensors``)."""
    from cmdare.predict.workloads import _WORKLOADS

    profiles = published_op_profiles()
    for name, w in _WORKLOADS.items():
        if round(w.model_flops) == round(model_flops) and int(w.num_params) == int(num_params):
            return profiles[name]
    tensors = max(int(round(num_tensors)), 1)
    same = [p for p in extra_op_profiles().values()
            if p.ops.size and len(p.params) == tensors and abs(p.param_count / max(num_params, 1.0) - 1) < 0.1]
    if same:  # a network profiled beside the CNNs (any head size): its nearest profile in FLOPs, scaled to them
        best = min(same, key=lambda p: abs(np.log(p.flops / PROFILE_BATCH / max(model_flops, 1.0))))
        return best.scaled(model_flops / (best.flops / PROFILE_BATCH))

    def dist(w) -> float:
        return (np.log(w.model_flops / max(model_flops, 1.0)) ** 2
                + np.log(w.num_tensors / tensors) ** 2)

    nearest = min(_WORKLOADS.values(), key=dist)
    scaled = profiles[nearest.name].scaled(model_flops / nearest.model_flops)
    size = max(int(round(num_params / tensors)), 1)
    return OpProfile(scaled.ops, [(f"t{i}", (size,)) for i in range(tensors)], scaled.batch)


def write_published_profiles(path: Path = _FILE) -> Path:
    """Profile the zoo twins of the published CNNs and write ``op_profiles.json``."""
    out = {}
    for name, zoo in ZOO_NAMES.items():
        p = profile_model_ops(zoo)
        out[name] = {"zoo_model": zoo, "ops": p.ops.astype(int).tolist(),
                     "params": [[n, list(s)] for n, s in p.params]}
    extra = {}
    for name, (shape, classes) in EXTRA_PROFILES.items():
        by_batch = {b: profile_model_ops(name, b, shape, classes) for b in EXTRA_BATCHES}
        extra[name] = {"input_shape": list(shape), "num_classes": classes,
                       "params": [[n, list(s)] for n, s in by_batch[EXTRA_BATCHES[0]].params],
                       "ops_by_batch": {str(b): p.ops.astype(int).tolist() for b, p in by_batch.items()}}
    payload = {"batch": PROFILE_BATCH, "input_shape": [3, 32, 32], "generator": "python -m cmdare.predict.op_profile",
               "profiles": out, "extra": extra}
    path.write_text(json.dumps(payload, separators=(",", ":")))
    return path


if __name__ == "__main__":
    print(write_published_profiles())


@lru_cache(maxsize=1024)
def tensor_list_for(num_params: float, num_tensors: float) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The trainable tensors ``(name, shape)`` of a workload: the published CNN's on an exact
    (#parameters, #tensors) match, else ``num_tensors`` equal-size tensors."""
    from cmdare.predict.workloads import _WORKLOADS

    for name, w in _WORKLOADS.items():
        if int(w.num_params) == int(num_params) and int(w.num_tensors) == int(round(num_tensors)):
            return tuple(published_op_profiles()[name].params)
    tensors = max(int(round(num_tensors)), 1)
    size = max(int(round(num_params / tensors)), 1)
    return tuple((f"t{i}", (size,)) for i in range(tensors))
