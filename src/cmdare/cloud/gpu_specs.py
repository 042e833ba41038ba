"""The GPU spec sheet (``cmdare/cloud/data/gpu_specs.yaml``): peak rates, memory and SM counts.

Every catalog GPU type has an entry, each figure with its source (vendor datasheets and
whitepapers). The step-time model reads it to answer for a GPU type the public data never measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from cmdare.errors import DataFormatError, UnknownNameError

#: GPU generations, oldest first (the spec sheet's ``architecture``).
ARCHITECTURES = ("Kepler", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper")

__all__ = ["ARCHITECTURES", "SPEC_FIELDS", "GpuSpec", "gpu_spec", "gpu_specs", "spec_sources"]

_FILE = Path(__file__).parent / "data" / "gpu_specs.yaml"
SPEC_FIELDS = ("fp32_tflops", "tf32_tflops", "half_tflops", "memory_bw_gbs", "memory_gb", "sms", "cuda_cores",
               "boost_mhz")


@dataclass(frozen=True)
class GpuSpec:
    """Figures of one GPU as one worker sees it (K80: one die)."""

    name: str
    fp32_tflops: float
    tf32_tflops: float
    half_tflops: float
    memory_bw_gbs: float
    memory_gb: float
    sms: int
    cuda_cores: int
    boost_mhz: float
    architecture: str = "Volta"

    @property
    def generation(self) -> int:
        """Index of :attr:`architecture` in :data:`ARCHITECTURES` (0 = Kepler)."""
        return ARCHITECTURES.index(self.architecture)

    @property
    def ridge_flops_per_byte(self) -> float:
        """FP32 FLOPs per DRAM byte where the roofline turns from memory- to compute-bound."""
        return self.fp32_tflops * 1e12 / (self.memory_bw_gbs * 1e9)


def _parse(path: Path) -> tuple[dict[str, GpuSpec], dict[str, dict[str, str]]]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise DataFormatError(f"GPU spec sheet {path}: {err}") from err
    specs, sources = {}, {}
    for name, entry in (raw or {}).get("gpus", {}).items():
        values, srcs = {}, {}
        for field in SPEC_FIELDS:
            item = (entry or {}).get(field)
            if not isinstance(item, dict) or "value" not in item or not str(item.get("source", "")).strip():
                raise DataFormatError(f"GPU spec sheet {path}: {name}.{field} needs a value and a source")
            value = item["value"]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise DataFormatError(f"GPU spec sheet {path}: {name}.{field} must be a positive number")
            values[field], srcs[field] = value, str(item["source"])
        arch = (entry or {}).get("architecture")
        if (not isinstance(arch, dict) or arch.get("value") not in ARCHITECTURES
                or not str(arch.get("source", "")).strip()):
            raise DataFormatError(f"GPU spec sheet {path}: {name}.architecture needs a value (one of "
                                  f"{', '.join(ARCHITECTURES)}) and a source")
        srcs["architecture"] = str(arch["source"])
        specs[name.upper()] = GpuSpec(
            name.upper(), **{k: (int(v) if k in ("sms", "cuda_cores") else float(v)) for k, v in values.items()},
            architecture=arch["value"],
        )
        sources[name.upper()] = srcs
    return specs, sources


@lru_cache(maxsize=1)
def _loaded() -> tuple[dict[str, GpuSpec], dict[str, dict[str, str]]]:
    return _parse(_FILE)


def gpu_specs() -> dict[str, GpuSpec]:
    """Every GPU type of the spec sheet, by upper-case name."""
    return dict(_loaded()[0])


def gpu_spec(name: str) -> GpuSpec:
    """The spec of GPU type ``name`` (case-insensitive).

    Raises:
        UnknownNameError: for a GPU type the spec sheet lacks (the message lists them).
    """
    specs = _loaded()[0]
    key = name.strip().upper()
    if key not in specs:
        raise UnknownNameError("GPU type", name, sorted(specs))
    return specs[key]


def spec_sources(name: str) -> dict[str, str]:
    """The source of each figure of GPU type ``name``."""
    gpu_spec(name)
    return dict(_loaded()[1][name.strip().upper()])
