"""Workload profiler: FLOPs, parameters, tensor sizes and checkpoint bytes of a model.

FLOPs are counted per layer, one multiply-add = 2 FLOPs (:mod:`cmdare.workloads.flops`: convolutions, linear,
batch-norm, recurrent and attention layers by formula, any other matrix product by torch's flop counter). The
forward runs on the ``meta`` device and named models are built there, so profiling even the largest model costs
no arithmetic. A model the meta trace cannot follow (``.item()`` on a mask, control flow on values, an
operation with no meta kernel) is counted on one real sample instead: a sample of its data where the caller has
one, else zeros of the input shape (as float32, then as int64 token ids); :attr:`WorkloadProfile.basis` says
which, and :class:`ProfileError` what failed when nothing could be counted.

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
    import torch
    from torch import nn

    from cmdare.workloads.specs import ModelSpec

__all__ = ["ProfileError", "WorkloadProfile", "count_flops_forward", "profile_model"]

_MIB = float(2**20)

#: How a profile's FLOPs were counted (:attr:`WorkloadProfile.basis`).
META, SAMPLE, ZEROS = "meta", "sample", "zeros"


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
    # how the FLOPs were counted: "meta" (traced, no arithmetic), "sample" (one real sample of the model's data),
    # "zeros" (a real input of zeros of the shape: the meta trace could not follow the model)
    basis: str = META

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


class ProfileError(UserInputError):
    """Raised when no forward pass of a model could be counted: the message says what the last try raised."""


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


def count_flops_forward(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Forward FLOPs for one float32 sample of ``input_shape`` (see :mod:`cmdare.workloads.flops`), traced on
    the ``meta`` device: a model not already there is copied there first, so the caller's model is untouched
    and nothing is computed."""
    import torch

    from cmdare.workloads.flops import count_forward

    meta = model if _on_meta(model) else copy.deepcopy(model).to("meta")
    return count_forward(meta, torch.empty((1, *input_shape), device="meta"))


def _on_meta(model: nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


def _count_module(model: nn.Module, shape: tuple[int, ...], sample: Any = None) -> tuple[int, str]:
    """FLOPs of one sample and how they were counted (``basis``): traced on the meta device with the input's
    dtype (the sample's; else float32, then int64 token ids), else run for real on a copy of the model on one
    sample (``sample``; else zeros of ``shape``, float32 then int64), with torch's random state left as it was.

    Raises:
        ProfileError: every try failed (the message names the real run's failure).
    """
    import torch

    from cmdare.workloads.flops import count_forward

    if sample is not None:
        metas = [_meta_like(sample)] if isinstance(sample, torch.Tensor) else []
        reals = [(sample, SAMPLE, "a real sample of its data")]
    else:
        metas = [torch.empty((1, *shape), dtype=t, device="meta") for t in (torch.float32, torch.int64)]
        reals = [(torch.zeros((1, *shape), dtype=t), ZEROS, f"a real {str(t).removeprefix('torch.')} input of zeros")
                 for t in (torch.float32, torch.int64)]
    failures: list[tuple[str, BaseException]] = []
    for x in metas:
        try:
            meta = model if _on_meta(model) else copy.deepcopy(model).to("meta")
            return count_forward(meta, x), META
        except Exception as err:  # noqa: BLE001 - the user's network does not trace: try for real
            failures.append(("the meta device", err))
    if _on_meta(model):
        raise ProfileError(_failure(failures))
    with torch.random.fork_rng(devices=[]):
        for x, basis, label in reals:
            try:
                return count_forward(copy.deepcopy(model), x), basis
            except Exception as err:  # noqa: BLE001 - the user's network fails on this input: say so
                failures.append((label, err))
    raise ProfileError(_failure(failures))


def _meta_like(sample: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.empty(sample.shape, dtype=sample.dtype, device="meta")


def _failure(failures: list[tuple[str, BaseException]]) -> str:
    """What failed, in one line: the real run's error (one that is not about the input's dtype where there is
    one), else the meta trace's."""
    real = [(label, err) for label, err in failures if not label.startswith("the meta device")] or failures
    label, err = next(((lb, e) for lb, e in real if not _dtype_complaint(e)), real[0])
    first = str(err).splitlines()[0] if str(err) else ""
    return f"its forward pass fails on {label} ({type(err).__name__}: {first})"


def _dtype_complaint(err: BaseException) -> bool:
    text = str(err)
    return "scalar type" in text or "dtype" in text or "Long, Int" in text


def _profile_module(
    name: str, model: nn.Module, shape: tuple[int, ...], num_classes: int, flops_forward: int | None = None,
    sample: Any = None,
) -> WorkloadProfile:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    sizes_bytes = [p.numel() * p.element_size() for p in params]
    num_params = sum(p.numel() for p in params)
    sink = _ByteCounter()
    torch.save(model.state_dict(), sink)
    fwd, basis = (flops_forward, META) if flops_forward is not None else _count_module(model, shape, sample)
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
        basis=basis,
    )


@functools.lru_cache(maxsize=256)
def _profile_by_name(name: str, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    import torch

    from cmdare.workloads.flops import count_forward
    from cmdare.workloads.registry import build_model

    # Build on the meta device (no initialisation cost, no RNG use), count FLOPs there, then give the
    # model real but uninitialised CPU storage: the state_dict then has exactly the trained model's bytes.
    with torch.device("meta"):
        model = build_model(name, num_classes=num_classes, in_channels=shape[0])
    fwd = count_forward(model, torch.empty((1, *shape), device="meta"))
    model = model.to_empty(device="cpu")
    return _profile_module(name, model, shape, num_classes, flops_forward=fwd)


def profile_model(
    name_or_module: str | nn.Module, input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
    *, sample: Any = None,
) -> WorkloadProfile:
    """Profile a registered model by name (cached) or a given module (not cached).

    Args:
        name_or_module: a name from :func:`~cmdare.workloads.list_models` or a ``torch.nn.Module``.
        input_shape: ``(C, H, W)`` of one sample; ``C`` is also the model's ``in_channels``. Your own model
            (an import path or a module): any shape of one sample.
        num_classes: classifier outputs (for a name; a module keeps its own).
        sample: for a module, a batch of one sample of its data (whatever its forward takes): traced with
            that dtype, and run for real on it where the trace fails (:attr:`WorkloadProfile.basis`).

    Returns:
        A frozen :class:`WorkloadProfile`.

    Raises:
        UnknownNameError: unknown model name.
        UserInputError: a malformed ``input_shape`` (needs C, H, W with H, W >= 8 for the zoo).
        ProfileError: no forward pass of the model could be counted (the message says why).
    """
    from cmdare.workloads.import_path import is_import_path

    if not isinstance(name_or_module, str):
        shape = () if sample is not None and not input_shape else _check_shape(input_shape, image=False)
        return _profile_module(type(name_or_module).__name__, name_or_module, shape, num_classes, sample=sample)
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
def _path_profile(path: str, shape: tuple[int, ...], num_classes: int) -> WorkloadProfile:
    from cmdare.workloads.registry import build_model

    model = build_model(path, num_classes, shape[0])
    try:
        return _profile_module(path, model, shape, num_classes)
    except ProfileError as err:  # the user's network does not take this input: one line, naming what failed
        raise ProfileError(f"--model {path}: cannot profile it on input of shape {','.join(map(str, shape))}: "
                           f"{err}; give the shape of one sample, --input-shape") from None


@functools.lru_cache(maxsize=256)
def _registered_profile(spec: ModelSpec, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    return _profile_by_name.__wrapped__(spec.name, shape, num_classes)


@functools.lru_cache(maxsize=256)
def _builtin_profile(name: str, shape: tuple[int, int, int], num_classes: int) -> WorkloadProfile:
    from cmdare.workloads.profile_cache import cached_profile

    return cached_profile(name, shape, num_classes, lambda: _profile_by_name(name, shape, num_classes),
                          WorkloadProfile.from_dict)
