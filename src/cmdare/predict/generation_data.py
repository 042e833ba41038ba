"""The measurements the cross-generation step-time model is fitted on, as :class:`Row` objects.

* **CM-DARE, K80 and P100** (``cmdare/speed_data/0latency_data.csv``): 16 CIFAR CNNs at batch 128, TensorFlow 1.10
  with a parameter server; one row per (CNN, GPU): the median of the 13 samples.
* **CM-DARE, V100** (``cmdare/speed_data_base/<cnn>v100/data.csv``): ResNet-15/32 and Shake-Shake small/big, the same
  set-up; the median of each run's ``global_step/sec`` after its first point (the start-up).
* **Gavel** (``gavel/single_gpu_throughputs.json``): PyTorch ResNet-18 (CIFAR-10) and ResNet-50 (ImageNet, 224x224)
  alone on one K80, P100 or V100 at batch 16-256, no parameter server; a zero (not measured) is left out.

Each row carries the operator profile of cmdare's twin of its network (``op_profiles.json``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from cmdare.predict.op_profile import OpProfile

__all__ = ["DATASETS", "Row", "training_rows"]

DATASETS = ("cmdare", "cmdare-v100", "gavel")
_BASE = {"res15": "Res15", "res32": "Res32", "shakesmall": "shakesmall", "shakebig": "shakebig"}
_GAVEL = {"ResNet-18": "resnet18", "ResNet-50": "resnet50"}


@dataclass(frozen=True)
class Row:
    """One measured configuration: a network's profile on one GPU, and its seconds per step."""

    dataset: str
    family: str
    model: str
    gpu: str
    batch: int
    step_time_s: float
    profile: OpProfile
    num_params: int
    num_tensors: int
    parameter_server: bool


def _family(cnn: str) -> str:
    return "Shake-Shake (CIFAR)" if cnn.startswith("shake") else "T2T ResNet (CIFAR)"


def _cmdare_rows() -> list[Row]:
    from cmdare.predict.data import load_single_gpu_speed
    from cmdare.predict.op_profile import published_op_profiles
    from cmdare.predict.workloads import _WORKLOADS

    profiles = published_op_profiles()
    df = load_single_gpu_speed()
    rows = []
    for (cnn, gpu), g in df.groupby(["cnn", "gpu"]):
        w = _WORKLOADS[cnn]
        rows.append(Row("cmdare", _family(cnn), cnn, str(gpu).upper(), 128, float(g["Step Time (s)"].median()),
                        profiles[cnn], w.num_params, w.num_tensors, True))
    return rows


def _cmdare_v100_rows() -> list[Row]:
    from cmdare.predict.data import _cmdare_dir
    from cmdare.predict.op_profile import published_op_profiles
    from cmdare.predict.workloads import _WORKLOADS

    rows = []
    for folder, cnn in _BASE.items():
        path = _cmdare_dir() / "speed_data_base" / f"{folder}v100" / "data.csv"
        if not path.exists():
            continue
        speed = pd.read_csv(path)["Value"].to_numpy(float)[1:]
        w = _WORKLOADS[cnn]
        rows.append(Row("cmdare-v100", _family(cnn), cnn, "V100", 128, 1.0 / float(np.median(speed)),
                        published_op_profiles()[cnn], w.num_params, w.num_tensors, True))
    return rows


def _gavel_rows() -> list[Row]:
    from cmdare.predict.op_profile import extra_op_profiles
    from cmdare.public_data import BUNDLED_DIR

    raw = json.loads((BUNDLED_DIR / "gavel" / "single_gpu_throughputs.json").read_text())
    profiles = extra_op_profiles()
    rows = []
    for gpu, jobs in raw["throughputs"].items():
        for job, steps_per_s in jobs.items():
            m = re.fullmatch(r"(.+) \(batch size (\d+)\)", job)
            if not m or m.group(1) not in _GAVEL or not steps_per_s:
                continue
            p = profiles[(_GAVEL[m.group(1)], int(m.group(2)))]
            rows.append(Row("gavel", m.group(1), m.group(1), gpu.upper(), int(m.group(2)), 1.0 / steps_per_s,
                            p, p.param_count, len(p.params), False))
    return rows


@lru_cache(maxsize=1)
def training_rows() -> tuple[Row, ...]:
    """Every bundled row (see module docstring)."""
    return (*_cmdare_rows(), *_cmdare_v100_rows(), *_gavel_rows())
