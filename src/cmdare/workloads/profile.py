"""Workload profiler: FLOPs, parameters, tensor sizes and checkpoint bytes of a model.

FLOPs are counted with forward hooks on ``Conv2d``, ``Linear`` and ``BatchNorm`` modules, one
multiply-add = 2 FLOPs: a convolution counts ``2 * (C_in / groups) * k_h * k_w`` per output element
(+1 with a bias), a linear layer ``2 * in_features`` per output (+1 with a bias), a batch norm 2 per
element (its folded scale and shift). Activations, pooling, residual additions and the Shake-Shake
mix are not counted (they are a few percent at most). The hooked forward runs on the ``meta``
device and named models are built there, so profiling even the largest model costs no arithmetic.

Training FLOPs use the usual convention backward ~= 2 x forward, so ``flops_per_sample_train =
3 * flops_per_sample_forward``. (Tensor2Tensor's "Model FLOPs" in the CM-DARE data follow the same
3x convention: ``t2t_resnet15`` profiles at ~0.63 GFLOPs per sample trained vs. the data's 0.631.)

Tensor sizes are those of the trainable parameter tensors, in MiB (2**20 bytes, as in the CM-DARE
data); ``checkpoint_bytes`` is measured: the bytes ``torch.save`` writes for the ``state_dict``
(including BN running statistics), counted as written (identical to saving into a ``BytesIO``).
"""

from __future__ import annotations

import copy
import functools
import io
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cmdare.errors import UserInputError

if TYPE_CHECKING:
    from torch import nn

    from cmdare.workloads.specs import ModelSpec

__all__ = ["WorkloadProfile", "count_flops_forward", "profile_model"]

_MIB = float(2**20)


@dataclass(frozen=True)
class WorkloadProfile:
    """Static figures of one model at one input shape (per sample, float32)."""

    name: str
    input_shape: tuple[int, ...]  # (C, H, W) for the zoo; any shape of one sample for your own model
    num_classes: int
    flops_per_sample_forward: int
    flops_per_sample_train: int
    num_params: int
    num_tensors: int
    avg_tensor_mb: float
    max_tensor_mb: float
    checkpoint_bytes: int

    @property
    def param_bytes(self) -> int:
        """Bytes of the trainable parameters (float32)."""
        return 4 * self.num_params

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of all fields (``input_shape`` as a list)."""
        out = asdict(self)
        out["input_shape"] = list(self.input_shape)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadProfile:
        """The profile :meth:`to_dict` wrote."""
        return cls(**{**data, "input_shape": tuple(data["input_shape"])})


class _ByteCounter(io.RawIOBase):
    """A write-only stream that counts bytes: ``torch.save`` writes the same bytes as into a
    ``BytesIO``, without holding a copy of the model (3x faster for the large Shake-Shake models)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.num_bytes += n
        return n


def _check_shape(input_shape: Any, image: bool = True) -> tuple[int, ...]:
    """``input_shape`` as integers: ``(C, H, W)`` with H, W >= 8 for an image model (the zoo), any shape of
    positive sizes for your own model (``image`` False)."""
    try:
        shape = tuple(int(v) for v in input_shape)
    except (TypeError, ValueError):
        raise UserInputError(f"input shape must be integers such as C,H,W, got {input_shape!r}") from None
    if not image:
        if not shape or min(shape) < 1:
            raise UserInputError(f"input shape must be one or more positive sizes, got {input_shape!r}")
        return shape
    if len(shape) != 3 or shape[0] < 1 or min(shape[1:]) < 8:
        raise UserInputError(f"input shape must be C,H,W with C >= 1 and H, W >= 8, got {input_shape!r}")
    return shape


def count_flops_forward(model: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Forward FLOPs for one sample (see the module docstring for what counts).

    A model not already on the ``meta`` device is copied there first, so the caller's model is
    untouched and nothing is computed.
    """

    meta = model if _on_meta(model) else copy.deepcopy(model).to("meta")
    return _count_on_meta(meta, input_shape)


def _on_meta(model: nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


def _count_on_meta(meta: nn.Module, input_shape: tuple[int, int, int]) -> int:
    import torch
    from torch import nn

    total = 0

    def conv_hook(mod: nn.Conv2d, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        k = mod.kernel_size[0] * mod.kernel_size[1] * (mod.in_channels // mod.groups)
        total += out.numel() * (2 * k + (1 if mod.bias is not None else 0))

    def linear_hook(mod: nn.Linear, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        total += out.numel() * (2 * mod.in_features + (1 if mod.bias is not None else 0))

    def bn_hook(_mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        total += 2 * out.numel()

    handles = []
    for mod in meta.modules():
        if isinstance(mod, nn.Conv2d):
            handles.append(mod.register_forward_hook(conv_hook))
        elif isinstance(mod, nn.Linear):
            handles.append(mod.register_forward_hook(linear_hook))
        elif isinstance(mod, nn.modules.batchnorm._BatchNorm):
            handles.append(mod.register_forward_hook(bn_hook))
    was_training = meta.training
    meta.eval()
    try:
        with torch.no_grad():
            meta(torch.empty((1, *input_shape), device="meta"))
    finally:
        meta.train(was_training)
        for h in handles:
            h.remove()
    return int(total)


def _profile_module(
    name: str, model: nn.Module, shape: tuple[int, int, int], num_classes: int, flops_forward: int | None = None
) -> WorkloadProfile:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    sizes_bytes = [p.numel() * p.element_size() for p in params]
    num_params = sum(p.numel() for p in params)
    sink = _ByteCounter()
    torch.save(model.state_dict(), sink)
    fwd = count_flops_forward(model, shape) if flops_forward is None else flops_forward
    return WorkloadProfile(
        name=name,
        input_shape=shape,
        num_classes=num_classes,
        flops_per_sample_forward=fwd,
        flops_per_sample_train=3 * fwd,
        num_params=int(num_params),
        num_tensors=len(params),
        avg_tensor_mb=(sum(sizes_bytes) / len(params) / _MIB) if params else 0.0,
        max_tensor_mb=(max(sizes_bytes) / _MIB) if params else 0.0,
        checkpoint_bytes=sink.num_bytes,
    )


@functools.lru_cache(maxsize=256)
def _profile_by_name(name: str, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    import torch

    from cmdare.workloads.registry import build_model

    # Build on the meta device (no initialisation cost, no RNG use), count FLOPs there, then give the
    # model real but uninitialised CPU storage: the state_dict then has exactly the trained model's bytes.
    with torch.device("meta"):
        model = build_model(name, num_classes=num_classes, in_channels=shape[0])
    fwd = _count_on_meta(model, shape)
    model = model.to_empty(device="cpu")
    return _profile_module(name, model, shape, num_classes, flops_forward=fwd)


def profile_model(
    name_or_module: str | nn.Module, input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10
) -> WorkloadProfile:
    """Profile a registered model by name (cached) or a given module (not cached).

    Args:
        name_or_module: a name from :func:`~cmdare.workloads.list_models` or a ``torch.nn.Module``.
        input_shape: ``(C, H, W)`` of one sample; ``C`` is also the model's ``in_channels``.
        num_classes: classifier outputs (for a name; a module keeps its own).

    Returns:
        A frozen :class:`WorkloadProfile`.

    Raises:
        UnknownNameError: unknown model name.
        UserInputError: a malformed ``input_shape`` (needs C, H, W with H, W >= 8).
    """
    from cmdare.workloads.import_path import is_import_path

    if not isinstance(name_or_module, str):
        shape = _check_shape(input_shape, image=False)
        return _profile_module(type(name_or_module).__name__, name_or_module, shape, num_classes)
    from cmdare.workloads.families import builtin_model_names
    from cmdare.workloads.registry import check_model_name
    from cmdare.workloads.specs import MODELS

    name, classes = name_or_module, int(num_classes)
    check_model_name(name)
    shape = _check_shape(input_shape, image=not is_import_path(name))
    if is_import_path(name):
        return _path_profile(name, shape, classes)  # the user's code may change: kept for this process only
    spec = MODELS.get(name)
    if name not in builtin_model_names() or (spec is not None and not spec.builtin):
        return _registered_profile(spec, shape, classes)  # keyed by the registration: one under the same name
    return _builtin_profile(name, shape, classes)            # later is profiled anew


@functools.lru_cache(maxsize=64)
def _path_profile(path: str, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    from cmdare.workloads.registry import build_model

    model = build_model(path, num_classes, shape[0])
    try:
        return _profile_module(path, model, shape, num_classes)
    except Exception as err:  # noqa: BLE001 - the user's network does not take this input: one line
        first = str(err).splitlines()[0] if str(err) else ""
        raise UserInputError(f"--model {path}: cannot profile it on input of shape {','.join(map(str, shape))} "
                             f"({type(err).__name__}: {first}); give the shape of one sample, --input-shape") from None


@functools.lru_cache(maxsize=256)
def _registered_profile(spec: ModelSpec, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    return _profile_by_name.__wrapped__(spec.name, shape, num_classes)


@functools.lru_cache(maxsize=256)
def _builtin_profile(name: str, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    from cmdare.workloads.profile_cache import cached_profile

    return cached_profile(name, shape, num_classes, lambda: _profile_by_name(name, shape, num_classes),
                          WorkloadProfile.from_dict)
