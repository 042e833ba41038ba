"""GPU throughput table and the feature matrices the models take.

Models take plain numeric arrays whose column order is fixed here (``STEP_COLUMNS`` ...), so they
stay ordinary scikit-learn estimators; :func:`table_features` turns a user's CSV-like table (the
CM-DARE column names) into such an array, checking every value and naming the row and column of
the first bad one. NaNs never reach a model: a missing optional column is filled from a documented
rule, otherwise the row is rejected.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cmdare.cloud.gpu_counts import parse_gpu_counts  # re-exported: one parser for every GPU mix
from cmdare.errors import DataFormatError, UnknownNameError

__all__ = [
    "fixed_width",
    "CHECKPOINT_COLUMNS",
    "STEP_COLUMNS",
    "gpu_tflops",
    "impute_num_tensors",
    "parse_gpu_counts",
    "table_features",
]

STEP_COLUMNS = ("GPU TFLOPS", "Model FLOPs", "Number of Parameters", "Number of Tensors", "Latency (ms)")
CHECKPOINT_COLUMNS = ("Checkpoint Size (MB)", "Number of Tensors")
DEFAULT_LATENCY_MS = 0.3  # worker-PS latency of the 0-latency measurements (same zone)


def fixed_width(X: np.ndarray, width: int, fill: float = 0.0) -> np.ndarray:
    """``X`` cut or padded to ``width`` columns (padding with ``fill``).

    The models document their column order; a narrower array (as in scikit-learn's generic
    estimator checks) reads its missing trailing columns as ``fill``.
    """
    if X.shape[1] >= width:
        return X[:, :width]
    return np.hstack([X, np.full((X.shape[0], width - X.shape[1]), fill)])


def gpu_tflops(name: str) -> float:
    """FP32 peak TFLOPS of a GPU type (case-insensitive, e.g. ``k80``, ``V100``).

    The single source of GPU facts is the server catalog, :func:`cmdare.cloud.catalog.gpu_tflops`
    (K80 4.113 for one die as in the CM-DARE data, P100 9.526, V100 15.7, T4 8.1, L4 30.3,
    A100 19.5, H100 SXM 67; sources in the catalog file).

    Raises:
        UnknownNameError: for a GPU type the catalog does not know (the message lists them).
    """
    from cmdare.cloud.catalog import gpu_tflops as catalog_tflops

    return float(catalog_tflops(name.strip()))


def impute_num_tensors(flops: np.ndarray, params: np.ndarray) -> np.ndarray:
    """#tensors for workloads that lack it: the published CNN's count on an exact feature match,
    else a ResNet-like estimate of one tensor per 18k parameters (ResNet-15/32 and Custom ResNets
    have 14-20k parameters per tensor), at least 10."""
    from cmdare.predict.workloads import _WORKLOADS

    known = {(round(w.model_flops), w.num_params): w.num_tensors for w in _WORKLOADS.values()}
    out = np.empty(len(flops))
    for i, (f, p) in enumerate(zip(flops, params, strict=True)):
        out[i] = known.get((round(f), int(p)), max(10.0, p / 18_000.0))
    return out


#: The largest value each input column may hold: far above any real workload or cluster, low enough that no
#: question can make the predictors' work or memory unbounded (a tensor count of 1e308 grew to 7.8 GB).
LIMITS = {
    "GPU TFLOPS": 1e4,
    "Model FLOPs": 1e18,
    "Number of Parameters": 1e13,
    "Number of Tensors": 1e6,
    "Average Tensor Size (MB)": 1e7,
    "Latency (ms)": 1e5,
    "Checkpoint Size (MB)": 1e8,
    "Index File Size": 1e8,
    "PS": 1e3,
    "Workers": 1e4,
}


def _numeric(df: pd.DataFrame, col: str, *, allow_zero: bool = True) -> np.ndarray:
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
    raw = df[col].to_numpy()
    limit = LIMITS.get(col, np.inf)
    for i, v in enumerate(values):
        if not np.isfinite(v):
            raise DataFormatError(f"row {i + 1}, column {col!r}: {raw[i]!r} is not a number")
        if v < 0 or (not allow_zero and v == 0):
            raise DataFormatError(f"row {i + 1}, column {col!r}: {raw[i]!r} must be positive")
        if v > limit:
            raise DataFormatError(f"row {i + 1}, column {col!r}: {raw[i]} is beyond the largest value cmdare "
                                  f"answers for ({limit:g})")
    return values


def _within_tensor_limit(tensors: np.ndarray, how: str) -> np.ndarray:
    limit = LIMITS["Number of Tensors"]
    for i, t in enumerate(tensors):
        if t > limit:
            raise DataFormatError(f"row {i + 1}: {how} gives {t:.3g} tensors, beyond the largest value cmdare "
                                  f"answers for ({limit:g})")
    return tensors


def _require(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise DataFormatError(f"missing column(s) {', '.join(map(repr, missing))}; have {list(df.columns)}")


def table_features(df: pd.DataFrame, kind: str) -> np.ndarray:
    """The model input array for a table with CM-DARE column names.

    Args:
        df: the user's table (one question per row).
        kind: ``step`` (-> ``STEP_COLUMNS``) or ``checkpoint`` (-> ``CHECKPOINT_COLUMNS``).

    Raises:
        DataFormatError: naming the first bad row and column (missing column, non-number, negative).
    """
    if kind == "step":
        _require(df, ["GPU TFLOPS", "Model FLOPs", "Number of Parameters"])
        tf = _numeric(df, "GPU TFLOPS", allow_zero=False)
        flops = _numeric(df, "Model FLOPs", allow_zero=False)
        params = _numeric(df, "Number of Parameters", allow_zero=False)
        if "Number of Tensors" in df.columns:
            tensors = _numeric(df, "Number of Tensors", allow_zero=False)
        elif "Average Tensor Size (MB)" in df.columns:
            avg = _numeric(df, "Average Tensor Size (MB)", allow_zero=False)
            tensors = _within_tensor_limit(params * 4 / (avg * 2**20), "'Average Tensor Size (MB)'")
        else:
            tensors = _within_tensor_limit(impute_num_tensors(flops, params), "'Number of Parameters' / 18k")
        lat = _numeric(df, "Latency (ms)") if "Latency (ms)" in df.columns else np.full(len(df), DEFAULT_LATENCY_MS)
        return np.column_stack([tf, flops, params, tensors, lat])
    if kind == "checkpoint":
        _require(df, ["Checkpoint Size (MB)"])
        size = _numeric(df, "Checkpoint Size (MB)", allow_zero=False)
        if "Number of Tensors" in df.columns:
            tensors = _numeric(df, "Number of Tensors", allow_zero=False)
        elif "Index File Size" in df.columns:
            tensors = _within_tensor_limit(_numeric(df, "Index File Size", allow_zero=False) / INDEX_KB_PER_TENSOR,
                                           "'Index File Size'")
        else:
            tensors = np.full(len(df), np.nan)
        return np.column_stack([size, tensors])
    raise UnknownNameError("feature kind", kind, ["step", "checkpoint"])


# TensorFlow checkpoint index bytes per variable: median of Index File Size / #tensors over the 16
# CNNs of checkpoint/aggregated.csv that give both (0.100-0.108 KB).
INDEX_KB_PER_TENSOR = 0.1054
