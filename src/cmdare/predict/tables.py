"""Answer a whole table of questions: the user's rows in, the same rows plus a prediction out.

Input columns are named as in the CM-DARE CSVs; any other column (``key`` ...) is kept untouched.
Every value is checked and the first bad one is reported with its row (1-based, header excluded)
and column, so a NaN can never slip into a prediction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cmdare.errors import DataFormatError, DataNotFoundError, UnknownNameError
from cmdare.predict.features import _numeric, _require, gpu_tflops, parse_gpu_counts, table_features

__all__ = ["KINDS", "predict_table", "read_table", "write_table"]

KINDS = {
    "step-time": "Predicted Step Time (s)",
    "cluster-speed": "Predicted Speed (steps/sec)",
    "checkpoint": "Predicted Duration (s)",
}


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV keeping every cell's text as is.

    Raises:
        DataNotFoundError: if the file does not exist.
        DataFormatError: if it cannot be parsed or has no rows.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"input table {path} does not exist")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataFormatError(f"{path}: cannot read as CSV ({err})") from err
    if df.empty:
        raise DataFormatError(f"{path}: no rows")
    df.columns = [str(c).strip() for c in df.columns]
    return df


def write_table(df: pd.DataFrame, path: str | Path, force: bool = False) -> Path:
    """Write the answered table as CSV, as :func:`cmdare.output_files.open_output` writes a file: whole, and
    never over an existing file unless ``force``."""
    from cmdare.output_files import write_output

    return write_output(path, df.to_csv(index=False), "--output", force)


def _cluster_predictions(df: pd.DataFrame) -> np.ndarray:
    from cmdare.predict import cluster_speed_model, step_time_model

    _require(df, ["PS"])
    if "GPUs" not in df.columns and not {"GPU TFLOPS", "Workers"} <= set(df.columns):
        raise DataFormatError("cluster-speed needs a 'GPUs' column (e.g. k80:2,p100:1) or 'GPU TFLOPS' and 'Workers'")
    ps = _numeric(df, "PS", allow_zero=False)
    workers = _numeric(df, "Workers", allow_zero=False) if "Workers" in df.columns else None
    base = df.copy()
    if "GPU TFLOPS" not in base.columns:
        base["GPU TFLOPS"] = "1"  # placeholder; replaced per GPU type below
    step_X = table_features(base, "step")
    step_model, cluster = step_time_model(), cluster_speed_model()
    out = np.empty(len(df))
    for i in range(len(df)):
        for col, v in (("PS", ps[i]), ("Workers", None if workers is None else workers[i])):
            if v is not None and v != int(v):
                raise DataFormatError(f"row {i + 1}, column {col!r}: {v} is not a whole number")
        if "GPUs" in df.columns:
            try:
                counts = parse_gpu_counts(df["GPUs"].iloc[i])
            except (DataFormatError, UnknownNameError) as err:
                raise DataFormatError(f"row {i + 1}, column 'GPUs': {err}") from err
            if workers is not None and int(workers[i]) != sum(counts.values()):
                raise DataFormatError(
                    f"row {i + 1}, column 'Workers': {int(workers[i])} != {sum(counts.values())} GPUs"
                )
            tflops = [gpu_tflops(g) for g in counts]
            nums = list(counts.values())
        else:
            tflops, nums = [step_X[i, 0]], [int(workers[i])]
        rows = np.repeat(step_X[i : i + 1], len(tflops), axis=0)
        rows[:, 0] = tflops
        times = step_model.predict(rows)
        out[i] = cluster.predict_mixed(list(times), nums, step_X[i, 2], step_X[i, 3], int(ps[i]))
    return out


def predict_table(df: pd.DataFrame, kind: str, remote: bool = False) -> pd.DataFrame:
    """The rows of ``df`` plus a ``Predicted ...`` column for ``kind`` (see :data:`KINDS`).

    For checkpoints, ``remote`` (save + upload to a bucket) applies unless a ``Remote`` column
    (true/false) says otherwise per row.

    Raises:
        DataFormatError: naming the first bad row and column.
        UnknownNameError: for an unknown kind.
    """
    from cmdare.predict import checkpoint_model, step_time_model

    if kind not in KINDS:
        raise UnknownNameError("prediction kind", kind, list(KINDS))
    if kind == "step-time":
        pred = step_time_model().predict(table_features(df, "step"))
    elif kind == "cluster-speed":
        pred = _cluster_predictions(df)
    else:
        if "Remote" in df.columns:
            flags = df["Remote"].astype(str).str.strip().str.lower()
            bad = ~flags.isin(["true", "false", "1", "0", "yes", "no"])
            if bad.any():
                i = int(np.argmax(bad.to_numpy()))
                raise DataFormatError(f"row {i + 1}, column 'Remote': {df['Remote'].iloc[i]!r} is not true/false")
            remote_rows = flags.isin(["true", "1", "yes"]).to_numpy()
        else:
            remote_rows = np.full(len(df), remote)
        X = table_features(df, "checkpoint")
        pred = np.where(remote_rows, checkpoint_model(True).predict(X), checkpoint_model(False).predict(X))
    if not np.all(np.isfinite(pred)):
        raise DataFormatError("a prediction is not finite; check the input values")
    out = df.copy()
    out[KINDS[kind]] = pred
    return out
