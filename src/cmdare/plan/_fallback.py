"""TEMPORARY stand-ins read straight from the shared data, used only while ``cmdare.predict`` and
``cmdare.cloud`` are not in the tree. Delete once they land (no second copy of a model in plan/).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import numpy as np

from cmdare.errors import UnknownNameError

# Peak FP32 TFLOPS (design notes section 7; T4 from NVIDIA's data sheet).
TFLOPS = {"k80": 4.113, "p100": 9.526, "v100": 15.7, "t4": 8.1}
# Whole-VM USD/h (on-demand, preemptible): ICAC 2019 rates for K80 and the CPU PS; others GCE 2019 list.
PRICES = {
    "k80": (0.723, 0.256),
    "p100": (1.65, 0.56),
    "v100": (2.67, 0.86),
    "t4": (0.52, 0.24),
    "cpu": (0.143, 0.035),
}
REGIONS = ("us-east1", "us-west1", "us-central1", "europe-west1")
FRAMEWORK_START_S = 55.0  # CM-DARE: TensorFlow cold start on a new VM


def _data() -> Path:
    from cmdare.predict.data import shared_data_dir

    return shared_data_dir() / "cmdare"


@cache
def _single_speed(cnn: str, gpu: str) -> float:
    with open(_data() / "speed_data" / "0latency_data.csv") as f:
        vals = [float(r["Speed (steps/sec)"]) for r in csv.DictReader(f)
                if r["Model (temp)"] == cnn and r["GPU (temp)"].lower() == gpu]
    return statistics.median(vals)


@cache
def _ps_capacity(cnn: str) -> float:
    prefix = {"Res15": "res15", "Res32": "res32", "shakebig": "shakebig100", "shakesmall": "shakesmall100"}
    best = 0.0
    for run in (_data() / "speed_and_cluster_size" / "p100").glob(prefix.get(cnn, "res32") + "*"):
        with open(run / "run_.-tag-global_step_sec.csv") as f:
            vals = [float(r["Value"]) for r in csv.DictReader(f)]
        best = max(best, statistics.median(vals[len(vals) // 5:]))
    return best


class FallbackSpeed:
    """Sum of worker speeds, smoothly capped by PS capacity (P100 data), ``cap * ps**0.77``."""

    def __init__(self, cnn: str):
        self.cnn = cnn

    def worker_steps_per_s(self, gpu: str) -> float:
        if gpu not in TFLOPS:
            raise UnknownNameError("GPU", gpu, TFLOPS)
        if gpu in ("k80", "p100"):
            return _single_speed(self.cnn, gpu)
        return _single_speed(self.cnn, "p100") * TFLOPS[gpu] / TFLOPS["p100"]

    def cluster_steps_per_s(self, gpus: Mapping[str, int], ps: int) -> float:
        total = sum(n * self.worker_steps_per_s(g) for g, n in gpus.items())
        if ps == 0:
            return total
        cap = _ps_capacity(self.cnn) * ps**0.77
        return float((total**-8 + cap**-8) ** (-1 / 8))


@cache
def _startup_rows(gpu: str, transient: bool, region: str) -> np.ndarray:
    kind = "pre" if transient else "on_demand"
    side = "west" if "west" in region else "east"
    rows = []
    name = gpu if gpu in ("k80", "p100") else "k80"
    for f in (_data() / "startup_time" / f"{kind}_{side}").glob(f"*{name}*"):
        with open(f) as fh:
            rows += [sum(float(v) for v in r.values()) for r in csv.DictReader(fh)]
    return np.array(rows)


class FallbackStartup:
    """A measured VM startup (provisioning + staging + booting) plus the framework's cold start."""

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        rows = _startup_rows(server if server != "cpu" else "k80", transient, region)
        return float(rows[rng.integers(rows.size)]) + FRAMEWORK_START_S


class FallbackPrices:
    """Whole-VM prices, same in every region."""

    def price_per_hour_usd(self, server: str, region: str, transient: bool) -> float:
        if server not in PRICES:
            raise UnknownNameError("server type", server, PRICES)
        if region not in REGIONS:
            raise UnknownNameError("region", region, REGIONS)
        return PRICES[server][1 if transient else 0]


def checkpoint_s(display_name: str) -> float:
    """Measured save+upload time of the workload's checkpoint."""
    with open(_data() / "checkpoint" / "ckpt.csv") as f:
        for r in csv.DictReader(f):
            if r["Model"].lower() == display_name.lower():
                return float(r["Duration mean (s)"])
    return 3.8


# Share of preemptible servers revoked before 24 h (CM-DARE, ICDCS 2020; CPU: a guess).
REVOKED_BY_24H = {"k80": 0.46, "p100": 0.54, "v100": 0.58, "t4": 0.55, "cpu": 0.5}


def fallback_lifetime(server: str):
    """Exponential lifetimes matching the revoked share by 24 h, capped at GCE's 24 h."""
    from cmdare.measure.lifetime_models import ExponentialLifetime

    share = REVOKED_BY_24H.get(server, 0.5)

    class _Capped(ExponentialLifetime):
        def sample(self, rng, size):
            return np.minimum(super().sample(rng, size), 86400.0)

    return _Capped(mean_s=86400.0 / -np.log(1 - share))
