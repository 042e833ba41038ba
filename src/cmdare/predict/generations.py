"""Step time across GPU generations: a per-operator roofline with efficiencies learned per generation.

A training step is priced from cmdare's operator profile (:mod:`cmdare.predict.op_profile`: FLOPs and DRAM bytes of
every operator, and its kind) on the GPU's spec sheet (:mod:`cmdare.cloud.gpu_specs`)::

    t = e_c[g] * F / P_path  +  e_m[g] * M / B  +  (PS run only) d * params + k_ps  (+ k_alone without a PS)
        + c * tensors / P

* ``F``: FLOPs of the compute-bound operators (intensity at or above the ridge ``P_path / B``), each over the peak
  of the path PyTorch runs it on: convolutions on TF32 tensor cores from Ampere on (``tf32_tflops``), other matrix
  products on the FP32 units (``fp32_tflops``); both on FP16/BF16 tensor cores (``half_tflops``) under mixed
  precision, where the activations' bytes also halve.
* ``M``: DRAM bytes of the memory-bound operators (elementwise, normalisation, pooling, and products below the ridge).
* ``e_c[g] >= 1`` and ``e_m[g] >= 1`` are the inverse efficiencies of generation ``g`` (1 = the spec sheet's peak),
  fitted per generation seen in the training data (Kepler, Pascal, Volta); a generation not seen is priced with the
  nearest seen one's (Turing, Ampere, Ada and Hopper with Volta's), which is the extrapolation a prediction names.
* ``d * params + k_ps``: the parameter server's pull and push and its per-step cost (CM-DARE's runs had one; the
  planner's runs do); ``k_alone``: the per-step cost of a job alone on a GPU (Gavel's runs).

Fitted by bounded least squares on relative error over :func:`cmdare.predict.generation_data.training_rows`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.optimize import lsq_linear

from cmdare.cloud.gpu_specs import ARCHITECTURES, GpuSpec
from cmdare.option_values import PRECISIONS, check_precision
from cmdare.predict.generation_data import Row, training_rows
from cmdare.predict.op_profile import OpProfile

__all__ = ["PRECISIONS", "GenerationStepModel", "check_precision_on", "generation_step_model", "precision_factor",
           "step_time_basis", "supports_precision"]

_SHARED = ("params_ps_per_G", "per_step_ps", "per_step_alone", "per_tensor")


def _path_peaks(spec: GpuSpec, precision: str) -> tuple[float, float]:
    """FLOP/s of ``(convolutions, other products)`` on ``spec`` at ``precision``."""
    if precision == "fp32":
        return spec.tf32_tflops * 1e12, spec.fp32_tflops * 1e12
    return spec.half_tflops * 1e12, spec.half_tflops * 1e12


def roofline_terms(profile: OpProfile, spec: GpuSpec, precision: str = "fp32") -> tuple[float, float]:
    """``(compute seconds at peak, memory seconds at peak)`` of one step of ``profile`` on ``spec``."""
    f, b, n, kind = profile.ops.T
    if precision != "fp32":
        b = b / 2.0
    bw = spec.memory_bw_gbs * 1e9
    conv_peak, mm_peak = _path_peaks(spec, precision)
    peak = np.where(kind == 1, conv_peak, mm_peak)
    compute = (f > 0) & (f >= peak / bw * b)
    return float((f * n / peak)[compute].sum()), float((b * n)[~compute].sum() / bw)


class GenerationStepModel:
    """The model of the module docstring; ``fit`` then ``predict``."""

    def _design(self, rows: list[Row], gens: list[int]) -> np.ndarray:
        out = np.zeros((len(rows), 2 * len(gens) + len(_SHARED)))
        for i, r in enumerate(rows):
            spec = _spec(r.gpu)
            comp, mem = roofline_terms(r.profile, spec)
            j = gens.index(self._nearest(spec.generation, gens))
            out[i, 2 * j:2 * j + 2] = comp, mem
            ps = 1.0 if r.parameter_server else 0.0
            per_tensor = r.num_tensors * 1e10 / (spec.fp32_tflops * 1e12)
            out[i, 2 * len(gens):] = (ps * r.num_params / 1e9, ps, 1.0 - ps, per_tensor)
        return out

    @staticmethod
    def _nearest(gen: int, gens: list[int]) -> int:
        return min(gens, key=lambda g: (abs(g - gen), -g))

    def fit(self, rows: list[Row]) -> GenerationStepModel:
        """Fit on measured rows; returns self."""
        self.generations_ = sorted({_spec(r.gpu).generation for r in rows})
        X = self._design(rows, self.generations_)
        y = np.array([r.step_time_s for r in rows])
        w = 1.0 / y
        lower = np.zeros(X.shape[1])
        lower[:2 * len(self.generations_)] = 1.0
        self.coef_ = lsq_linear(X * w[:, None], y * w, bounds=(lower, np.inf)).x
        self.gpus_ = sorted({r.gpu.upper() for r in rows})
        return self

    def predict(self, profile: OpProfile, spec: GpuSpec, num_params: int, num_tensors: int,
                precision: str = "fp32", parameter_server: bool = True) -> float:
        """Seconds per step of ``profile`` on ``spec``."""
        row = Row("", "", "", spec.name, profile.batch, 1.0, profile, num_params, num_tensors, parameter_server)
        X = self._design([row], self.generations_)
        if precision != "fp32":
            g = self.generations_.index(self._nearest(spec.generation, self.generations_))
            X[0, 2 * g:2 * g + 2] = roofline_terms(profile, spec, precision)
        return float(X[0] @ self.coef_)

    def efficiencies(self) -> dict[str, tuple[float, float]]:
        """``{architecture: (compute, memory) efficiency}`` (fractions of the spec sheet's peaks)."""
        return {ARCHITECTURES[g]: (1.0 / self.coef_[2 * i], 1.0 / self.coef_[2 * i + 1])
                for i, g in enumerate(self.generations_)}

    def nearest_architecture(self, spec: GpuSpec) -> str:
        """The measured generation whose efficiencies price ``spec`` (its own where measured)."""
        return ARCHITECTURES[self._nearest(spec.generation, self.generations_)]

    def basis(self, spec: GpuSpec) -> str:
        """Which measured generation a prediction for ``spec`` rests on, in words."""
        near = self.nearest_architecture(spec)
        if spec.name in self.gpus_:
            return f"{spec.name} ({spec.architecture}) is in its training data"
        return (f"{spec.architecture} at the efficiencies fitted on {near} (its training data: "
                f"{', '.join(self.gpus_)})")


def _spec(gpu: str) -> GpuSpec:
    from cmdare.cloud.gpu_specs import gpu_spec

    return gpu_spec(gpu)


@lru_cache(maxsize=8)
def generation_step_model(exclude: tuple[str, ...] = ()) -> GenerationStepModel:
    """The model fitted on every bundled row but those of the GPU types or datasets in ``exclude``."""
    drop = {e.upper() for e in exclude}
    rows = [r for r in training_rows() if r.gpu.upper() not in drop and r.dataset.upper() not in drop]
    return GenerationStepModel().fit(rows)


_NEEDS = {"fp32": "Kepler", "amp-fp16": "Pascal", "amp-bf16": "Ampere"}  # the oldest generation with the path


def supports_precision(gpu: str, precision: str) -> bool:
    """Whether GPU type ``gpu`` (a name) has the arithmetic ``precision`` needs (bf16: Ampere on; fp16: Pascal on).

    Raises:
        UnknownNameError: an unknown precision or GPU type.
    """
    return _spec(gpu).generation >= ARCHITECTURES.index(_NEEDS[check_precision(precision)])


def check_precision_on(gpu: str, precision: str) -> GpuSpec:
    """The spec of GPU type ``gpu`` if it has the arithmetic ``precision`` needs.

    Raises:
        UserInputError: it has not (one line naming the generation needed).
        UnknownNameError: an unknown precision or GPU type.
    """
    from cmdare.errors import UserInputError

    spec = _spec(gpu)
    if not supports_precision(gpu, precision):
        raise UserInputError(f"{spec.name} ({spec.architecture}) has no {precision[4:]} arithmetic: {precision} "
                             f"needs {_NEEDS[precision]} or newer")
    return spec


def precision_factor(profile: OpProfile, gpu: str | float, num_params: int, num_tensors: int, precision: str) -> float:
    """Step time at ``precision`` over step time in fp32 on GPU type ``gpu``, by the cross-generation model.

    Raises:
        UnknownNameError: an unknown precision.
        UserInputError: a GPU given by TFLOPS (its generation is unknown), or one without that precision's tensor
            path (bfloat16 needs Ampere or newer; float16 Pascal or newer).
    """
    from cmdare.errors import UserInputError

    if check_precision(precision) == "fp32":
        return 1.0
    if not isinstance(gpu, str):
        raise UserInputError(f"--precision {precision} needs a GPU type by name (its generation sets the speed-up), "
                             f"not {gpu!r} TFLOPS")
    spec = check_precision_on(gpu, precision)
    model = generation_step_model()
    fp32 = model.predict(profile, spec, num_params, num_tensors)
    return model.predict(profile, spec, num_params, num_tensors, precision) / fp32


def step_time_basis(gpus) -> str | None:
    """What the step times of the GPU types among ``gpus`` (names) that CM-DARE's single-GPU table lacks rest on, in
    one phrase; None when every one is in that table."""
    from cmdare.predict.data import GPU_TFLOPS_IN_DATA

    names = sorted({g.upper() for g in gpus} - set(GPU_TFLOPS_IN_DATA))
    if not names:
        return None
    model = generation_step_model()
    parts = []
    for name in names:
        if name in model.gpus_:
            parts.append(f"{name} measured in its training data")
        else:
            parts.append(f"{name} from its spec sheet at {model.nearest_architecture(_spec(name))}'s efficiencies")
    return f"step times of {', '.join(names)}: the cross-generation model ({'; '.join(parts)}), extrapolated"
