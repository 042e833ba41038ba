"""Importer of TensorBoard scalars: CSV exports (``Wall time,Step,Value``) and event files.

Tags map to tables: ``global_step/sec`` (also ``global_step_sec`` in export file names) to step
metrics (``cluster_steps_per_s``, worker_id -1 = the cluster) and, when ``workers`` is given, to cluster
speed samples; ``loss`` to step metrics; ``accuracy`` to eval metrics. Other tags are counted as
skipped with the reason "unmapped tag". The run row is created if the store does not have it.
"""

from __future__ import annotations

import re
from pathlib import Path

from cmdare.errors import DataFormatError
from cmdare.measure.importers.common import ImportResult, ParsedFile, require_path, write_import
from cmdare.measure.importers.tensorboard_csv import read_tb_csv
from cmdare.measure.store import Store

SPEED_TAGS = ("global_step/sec", "global_step_sec")
_EXPORT_TAG = re.compile(r"-tag-(.+)$")


def _canonical(tag: str) -> str:
    t = tag.strip().lower()
    if t in SPEED_TAGS:
        return "speed"
    if t == "loss" or t.endswith("/loss"):
        return "loss"
    if "accuracy" in t:
        return "accuracy"
    return ""


def _add_point(
    pf: ParsedFile,
    kind: str,
    tag: str,
    run_id: str,
    wall: float | None,
    step: int,
    value: float,
    workers: int | None,
    gpu_type: str | None,
    ps: int,
) -> None:
    pf.read += 1
    t = wall if wall is not None else 0.0
    if kind == "speed":
        pf.add(
            "step_metrics",
            {
                "run_id": run_id,
                "time": t,
                "global_step": step,
                "worker_id": -1,
                "steps": 0,
                "duration_s": 0.0,
                "loss": None,
                "cluster_steps_per_s": value,
            },
        )
        if workers:
            pf.add(
                "cluster_speed_samples",
                {
                    "source": "tensorboard",
                    "run_id": run_id,
                    "gpu_type": gpu_type,
                    "model_name": None,
                    "workers": workers,
                    "ps": ps,
                    "step": step,
                    "wall_time": wall,
                    "steps_per_s": value,
                },
            )
    elif kind == "loss":
        pf.add(
            "step_metrics",
            {
                "run_id": run_id,
                "time": t,
                "global_step": step,
                "worker_id": -1,
                "steps": 0,
                "duration_s": 0.0,
                "loss": value,
                "cluster_steps_per_s": None,
            },
        )
    elif kind == "accuracy":
        pf.add(
            "eval_metrics",
            {
                "run_id": run_id,
                "time": t,
                "global_step": step,
                "worker_id": None,
                "accuracy": value,
                "loss": None,
            },
        )
    else:
        pf.skip(f"unmapped tag {tag}")


def parse_tb_export(
    path: Path,
    run_id: str,
    tag: str | None = None,
    workers: int | None = None,
    gpu_type: str | None = None,
    ps: int = 1,
) -> ParsedFile:
    """One CSV export; the tag comes from ``tag`` or the export's file name (``run_.-tag-<tag>.csv``)."""
    if tag is None:
        m = _EXPORT_TAG.search(path.stem)
        tag = m.group(1) if m else "global_step/sec"
    kind = _canonical(tag)
    pf = ParsedFile("tensorboard-csv", path)
    pf.ensure_runs.append(
        {
            "run_id": run_id,
            "config": {"imported_from": str(path)},
            "status": "imported",
            "source": "tensorboard",
        }
    )
    for item in read_tb_csv(path):
        if isinstance(item, str):
            pf.read += 1
            pf.skip(item)
            continue
        wall, step, value = item
        _add_point(pf, kind, tag, run_id, wall, step, value, workers, gpu_type, ps)
    return pf


def parse_event_file(
    path: Path, run_id: str, workers: int | None = None, gpu_type: str | None = None, ps: int = 1
) -> ParsedFile:
    """Every scalar of one TensorBoard event file."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    pf = ParsedFile("tensorboard-events", path)
    pf.ensure_runs.append(
        {
            "run_id": run_id,
            "config": {"imported_from": str(path)},
            "status": "imported",
            "source": "tensorboard",
        }
    )
    try:
        for ev in EventFileLoader(str(path)).Load():
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    value = float(v.simple_value)
                elif v.HasField("tensor") and v.tensor.float_val:
                    value = float(v.tensor.float_val[0])
                elif v.HasField("tensor") and v.tensor.double_val:
                    value = float(v.tensor.double_val[0])
                else:
                    continue
                _add_point(
                    pf,
                    _canonical(v.tag),
                    v.tag,
                    run_id,
                    ev.wall_time,
                    int(ev.step),
                    value,
                    workers,
                    gpu_type,
                    ps,
                )
    except Exception as err:  # the loader raises assorted protobuf/IO errors on corrupt files
        raise DataFormatError(f"{path}: not a readable TensorBoard event file ({type(err).__name__})") from err
    return pf


def import_tensorboard(
    store: Store,
    path: str | Path,
    run_id: str,
    tag: str | None = None,
    workers: int | None = None,
    gpu_type: str | None = None,
    ps: int = 1,
) -> ImportResult:
    """Import a CSV export, an event file, or every ``*.csv`` / ``events.out.tfevents.*`` under a directory.

    Raises:
        DataNotFoundError: the path does not exist.
        DataFormatError: wrong columns, unreadable file, or a directory without TensorBoard files.
    """
    if not run_id or not run_id.strip():
        raise DataFormatError("--run NAME is required: the run the scalars belong to")
    root = require_path(path, "TensorBoard file or directory")
    files = (
        [root]
        if root.is_file()
        else sorted([p for p in root.rglob("*") if p.is_file() and (p.suffix == ".csv" or "tfevents" in p.name)])
    )
    if not files:
        raise DataFormatError(f"{root}: no TensorBoard CSV exports or event files (events.out.tfevents.*)")
    parsed = []
    for f in files:
        if f.suffix.lower() == ".csv":
            parsed.append(parse_tb_export(f, run_id, tag, workers, gpu_type, ps))
        else:
            parsed.append(parse_event_file(f, run_id, workers, gpu_type, ps))
    return write_import(store, parsed)
