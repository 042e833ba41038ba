"""Loaders of the public CM-DARE measurements (bundled in :mod:`cmdare.public_data`) as tidy pandas frames.

The models are fitted on these tables directly (no store needed); the tables ship with the package,
and ``CMDARE_SHARED_DATA`` may point to another copy (:func:`cmdare.public_data.public_data_dir`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from cmdare.public_data import public_data_dir

__all__ = [
    "CNN_CHECKPOINT_NAMES",
    "load_checkpoint",
    "load_cluster_speed",
    "load_latency_speed",
    "load_two_ps_cluster_speed",
    "load_single_gpu_speed",
    "load_startup",
]

GPU_TFLOPS_IN_DATA = {"K80": 4.113, "P100": 9.526}

# CNN names in the speed tables -> names in checkpoint/ckpt.csv (source of #tensors).
CNN_CHECKPOINT_NAMES: dict[str, str] = {
    "Res15": "ResNet-15",
    "Res32": "ResNet-32",
    **{f"custom{i}": f"Custom ResNet {i}" for i in range(1, 11)},
    "shake16": "Shake 16",
    "shakesmall": "Shake small",
    "shake48": "Shake 48",
    "shakemid": "Shake 64",
    "shake80": "Shake 80",
    "shakebig": "Shake Large",
}

# Folder prefixes of speed_and_cluster_size -> CNN names of the speed tables.
_CLUSTER_PREFIX = {"res15": "Res15", "res32": "Res32", "shakesmall": "shakesmall", "shakebig": "shakebig",
                   "shakesbig": "shakebig"}  # upstream's spelling in p100ps2/


def _cmdare_dir() -> Path:
    return public_data_dir() / "cmdare"


@lru_cache(maxsize=1)
def _tensor_counts() -> dict[str, int]:
    ck = pd.read_csv(_cmdare_dir() / "checkpoint" / "aggregated.csv")
    ck = ck.dropna(subset=["Number of Tensors"])
    by_ckpt = dict(zip(ck["Model"], ck["Number of Tensors"].astype(int), strict=True))
    return {cnn: by_ckpt[name] for cnn, name in CNN_CHECKPOINT_NAMES.items() if name in by_ckpt}


@lru_cache(maxsize=1)
def load_single_gpu_speed() -> pd.DataFrame:
    """Single-GPU step times, 16 CNNs x (K80, P100) x 13 samples, worker-PS latency 0.3 ms.

    Columns of ``speed_data/0latency_data.csv`` plus ``gpu``, ``cnn`` and ``Number of Tensors``
    (from the checkpoint table; tensors of the same CNNs).
    """
    df = pd.read_csv(_cmdare_dir() / "speed_data" / "0latency_data.csv")
    df = df.rename(columns={"GPU (temp)": "gpu", "Model (temp)": "cnn"})
    df["Number of Tensors"] = df["cnn"].map(_tensor_counts()).astype(float)
    return df.reset_index(drop=True)


@lru_cache(maxsize=1)
def load_latency_speed() -> pd.DataFrame:
    """Single-GPU step times with worker-PS latency 0.3 and 30.3 ms (``speed_data_supertable.csv``).

    Its ``Model FLOPs`` use another unit than ``0latency_data.csv``; rows are matched to CNNs by
    #parameters and given the FLOPs and #tensors of the 0-latency table, so features agree.
    """
    df = pd.read_csv(_cmdare_dir() / "speed_data" / "speed_data_supertable.csv")
    ref = load_single_gpu_speed().groupby("cnn").first()
    by_params = {int(p): cnn for cnn, p in ref["Number of Parameters"].items()}
    df["cnn"] = df["Number of Parameters"].astype(int).map(by_params)
    df["gpu"] = df["GPU TFLOPS"].map({v: k for k, v in GPU_TFLOPS_IN_DATA.items()})
    df["Model FLOPs"] = df["cnn"].map(ref["Model FLOPs"])
    df["Number of Tensors"] = df["cnn"].map(ref["Number of Tensors"])
    return df.reset_index(drop=True)


@lru_cache(maxsize=1)
def load_cluster_speed() -> pd.DataFrame:
    """Cluster training speed with 1 PS and 1-8 homogeneous workers, one row per configuration.

    ``Speed (steps/sec)`` is the median of the TensorBoard ``global_step/sec`` samples after the
    first 20% of the run (warm-up). Columns: gpu, cnn, Workers, PS, GPU TFLOPS, model features,
    ``Single Step Time (s)`` (mean of the single-GPU table for the same CNN and GPU).
    """
    return pd.DataFrame(_cluster_rows(ps=1))


@lru_cache(maxsize=1)
def load_two_ps_cluster_speed() -> pd.DataFrame:
    """Cluster training speed of the P100 runs with 2 PS and 1-8 workers (``speed_and_cluster_size/p100ps2``), the
    columns of :func:`load_cluster_speed` (``PS`` = 2). Not in the models' training data: the 2-PS check."""
    return pd.DataFrame(_cluster_rows(ps=2))


def _cluster_rows(ps: int) -> list[dict]:
    single = load_single_gpu_speed()
    ref = single.groupby("cnn").first()
    st = single.groupby(["gpu", "cnn"])["Step Time (s)"].mean()
    rows = []
    for gpu_dir in sorted((_cmdare_dir() / "speed_and_cluster_size").iterdir()):
        gpu, _, dir_ps = gpu_dir.name.upper().partition("PS")
        if gpu not in GPU_TFLOPS_IN_DATA or int(dir_ps or 1) != ps:
            continue
        for run in sorted(gpu_dir.iterdir()):
            name = run.name
            prefix = next(p for p in _CLUSTER_PREFIX if name.startswith(p))
            workers = int(name.rsplit("worker", 1)[1])
            values = pd.read_csv(run / "run_.-tag-global_step_sec.csv")["Value"].to_numpy(float)
            cnn = _CLUSTER_PREFIX[prefix]
            rows.append(
                {
                    "gpu": gpu,
                    "cnn": cnn,
                    "Workers": workers,
                    "PS": ps,
                    "GPU TFLOPS": GPU_TFLOPS_IN_DATA[gpu],
                    "Model FLOPs": ref.loc[cnn, "Model FLOPs"],
                    "Number of Parameters": ref.loc[cnn, "Number of Parameters"],
                    "Number of Tensors": ref.loc[cnn, "Number of Tensors"],
                    "Single Step Time (s)": st.loc[(gpu, cnn)],
                    "Speed (steps/sec)": float(np.median(values[len(values) // 5 :])),
                }
            )
    return rows


@lru_cache(maxsize=1)
def load_checkpoint() -> pd.DataFrame:
    """Checkpoint samples (5 per CNN, 20 CNNs): local save and save+upload to a bucket.

    Columns of ``checkpoint/whole_data.csv`` plus ``Number of Tensors`` and ``Number of
    Parameters`` where ``aggregated.csv`` knows them (NaN for 4 CNNs).
    """
    cdir = _cmdare_dir() / "checkpoint"
    df = pd.read_csv(cdir / "whole_data.csv")
    agg = pd.read_csv(cdir / "aggregated.csv")
    agg["key"] = agg["Model"].str.lower()
    df["key"] = df["Model"].str.lower()
    df = df.merge(agg[["key", "Number of Tensors", "Number of Parameters"]], on="key", how="left")
    df["Model"] = df["Model"].where(df["key"] != "shake large", "Shake Large")
    return df.drop(columns="key").reset_index(drop=True)


@lru_cache(maxsize=1)
def load_startup() -> pd.DataFrame:
    """VM startup phases (s): columns gpu, region, transient, Provisioning, Staging, Booting."""
    frames = []
    for folder in sorted((_cmdare_dir() / "startup_time").iterdir()):
        kind, region = folder.name.rsplit("_", 1)
        for f in sorted(folder.glob("*.csv")):
            df = pd.read_csv(f)
            df["gpu"] = "P100" if "p100" in f.name else "K80"
            df["region"] = region
            df["transient"] = kind == "pre"
            frames.append(df)
    return pd.concat(frames, ignore_index=True)
