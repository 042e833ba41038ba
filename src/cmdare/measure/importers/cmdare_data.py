"""Importer of CM-DARE's processed CSVs (github.com/cake-lab/CM-DARE ``data/processed_data``).

Layout (see the shared data README): ``speed_data/`` single-GPU speed tables,
``speed_data_base/<model><gpu>/data.csv`` single-worker TensorBoard exports (K80, P100, V100),
``speed_and_cluster_size/<gpu>/<model><gpu>worker<N>/*.csv`` cluster speed with 1 PS (and
``p100ps2/<model>p100ps2worker<N>`` with 2 PS),
``checkpoint/`` checkpoint timings, ``startup_time/<on_demand|pre>_<region>/*.csv`` VM startup phases,
``chief_rejoining/*.csv`` accuracy curves when the chief is revoked and rejoins.
Files that duplicate or aggregate another imported file are reported as skipped with that reason.
"""

from __future__ import annotations

import re
from pathlib import Path

from cmdare.errors import DataFormatError
from cmdare.measure.importers.common import (
    FileResult,
    ImportResult,
    ParsedFile,
    read_csv_rows,
    require_path,
    to_float,
    write_import,
)
from cmdare.measure.importers.tensorboard_csv import parse_tb_csv_speed, read_tb_csv
from cmdare.measure.store import Store

SOURCE = "cmdare"
GPU_BY_TFLOPS = {4.113: "k80", 9.526: "p100", 15.7: "v100"}  # FP32 peak as in the data
MB = 1 << 20
SPEED_COLUMNS = (
    "GPU TFLOPS",
    "Model FLOPs",
    "Latency (ms)",
    "Average Tensor Size (MB)",
    "Max Tensor Size (MB)",
    "Number of Parameters",
    "Speed (steps/sec)",
    "Step Time (s)",
)
NAMED_SPEED_COLUMNS = (*SPEED_COLUMNS, "GPU (temp)", "Model (temp)")
CKPT_COLUMNS = ("Model", "Local duration", "Duration", "Checkpoint Size (MB)")
AGG_COLUMNS = ("Model", "Number of Tensors", "Number of Parameters")
STARTUP_COLUMNS = ("Provisioning", "Staging", "Booting")
# upstream spells Shake-Shake big "shakesbig" in its 2-PS runs (p100ps2/shakesbigp100ps2worker<N>)
_CLUSTER_DIR = re.compile(r"^(res15|res32|shakesmall|shakebig|shakesbig)(k80|p100|80|100)(?:ps(\d))?worker(\d+)$")
_BASE_DIR = re.compile(r"^(res15|res32|shakesmall|shakebig)(k80|p100|v100)$")
_STARTUP_DIR = re.compile(r"^(on_demand|pre)_(east|west)$")
_REJOIN_FILE = re.compile(r"^exp-(\d+)(?:-\d+)?$")
SKIP_AS = {
    "speed_data/0latency_k80.csv": "duplicate of speed_data/0latency_data.csv (K80 rows)",
    "speed_data/0latency_p100.csv": "duplicate of speed_data/0latency_data.csv (P100 rows)",
    "checkpoint/unaggregated_training.csv": "subset of checkpoint/whole_data.csv",
    "checkpoint/unaggregated_test.csv": "subset of checkpoint/whole_data.csv",
    "checkpoint/ckpt.csv": "aggregate of checkpoint/whole_data.csv",
}


def _gpu_of(tflops: float | None) -> str | None:
    if tflops is None:
        return None
    return next((g for t, g in GPU_BY_TFLOPS.items() if abs(t - tflops) < 1e-3), None)


def _ckpt_key(name: str) -> str:
    return name.strip().lower().replace(" mid ", " 64 ")


def parse_speed_table(path: Path, names: dict[int, str] | None = None) -> ParsedFile:
    """Single-GPU speed rows; ``names`` maps #params to a CNN name for the unnamed table."""
    header, rows = read_csv_rows(path, SPEED_COLUMNS)
    named = "Model (temp)" in header
    pf = ParsedFile("cmdare-speed", path)
    source = f"{SOURCE}:{path.stem}"
    for row in rows:
        pf.read += 1
        vals = {c: to_float(row.get(c)) for c in SPEED_COLUMNS}
        if vals["Speed (steps/sec)"] is None or vals["Speed (steps/sec)"] <= 0:
            pf.skip("missing or non-positive steps/sec")
            continue
        flops, params = vals["Model FLOPs"], vals["Number of Parameters"]
        name = (row.get("Model (temp)") or "").strip() if named else None
        if not name and names and flops is not None and params is not None:
            name = names.get(int(params))
        gpu = (row.get("GPU (temp)") or "").strip().lower() if named else None
        pf.add(
            "speed_samples",
            {
                "source": source,
                "gpu_type": gpu or _gpu_of(vals["GPU TFLOPS"]),
                "gpu_tflops": vals["GPU TFLOPS"],
                "model_name": name or None,
                "model_flops": flops,
                "num_params": None if params is None else int(params),
                "num_tensors": None,
                "avg_tensor_mb": vals["Average Tensor Size (MB)"],
                "max_tensor_mb": vals["Max Tensor Size (MB)"],
                "latency_ms": vals["Latency (ms)"],
                "steps_per_s": vals["Speed (steps/sec)"],
                "step_time_s": vals["Step Time (s)"],
                "emulated": False,
            },
        )
    return pf


def parse_checkpoints(path: Path, agg_path: Path | None) -> ParsedFile:
    """Unaggregated checkpoint timings; #tensors/#params joined from ``aggregated.csv`` by model."""
    extra: dict[str, tuple[int | None, int | None]] = {}
    if agg_path is not None and agg_path.exists():
        _, agg = read_csv_rows(agg_path, AGG_COLUMNS)
        for r in agg:
            nt, npar = to_float(r["Number of Tensors"]), to_float(r["Number of Parameters"])
            extra[_ckpt_key(r["Model"])] = (
                None if nt is None else int(nt),
                None if npar is None else int(npar),
            )
    _, rows = read_csv_rows(path, CKPT_COLUMNS)
    pf = ParsedFile("cmdare-checkpoint", path)
    for row in rows:
        pf.read += 1
        size = to_float(row.get("Checkpoint Size (MB)"))
        local, remote = to_float(row.get("Local duration")), to_float(row.get("Duration"))
        if size is None or local is None or size <= 0:
            pf.skip("missing size or local duration")
            continue
        nt, npar = extra.get(_ckpt_key(row["Model"]), (None, None))
        pf.add(
            "checkpoints",
            {
                "run_id": None,
                "model_name": row["Model"].strip(),
                "size_bytes": int(round(size * MB)),
                "num_tensors": nt,
                "num_params": npar,
                "local_duration_s": local,
                "remote_duration_s": remote,
                "source": f"{SOURCE}:checkpoint",
            },
        )
    return pf


def parse_startup(path: Path, transient: bool, region: str) -> ParsedFile:
    """VM startup phases of one (GPU, market, region) file as servers with phase seconds."""
    _, rows = read_csv_rows(path, STARTUP_COLUMNS)
    m = re.search(r"(k80|p100|v100)", path.name.lower())
    gpu = m.group(1) if m else None
    pf = ParsedFile("cmdare-startup", path)
    for i, row in enumerate(rows):
        pf.read += 1
        prov, stag, boot = (to_float(row.get(c)) for c in STARTUP_COLUMNS)
        if prov is None or stag is None or boot is None or min(prov, stag, boot) < 0:
            pf.skip("missing or negative phase time")
            continue
        pf.add(
            "servers",
            {
                "server_id": f"{path.stem}-{i}",
                "run_id": None,
                "role": "worker",
                "gpu_type": gpu,
                "region": f"us-{region}",
                "cloud": "gcp",
                "transient": transient,
                "provisioning_s": prov,
                "staging_s": stag,
                "booting_s": boot,
                "source": f"{SOURCE}:startup",
            },
        )
    return pf


def parse_rejoin(path: Path) -> ParsedFile:
    """Accuracy over steps of one chief-rejoining experiment (or baseline)."""
    m = _REJOIN_FILE.match(path.stem)
    pf = ParsedFile("cmdare-chief-rejoin", path)
    for item in read_tb_csv(path):
        pf.read += 1
        if isinstance(item, str):
            pf.skip(item)
            continue
        wall, step, acc = item
        pf.add(
            "chief_rejoin_points",
            {
                "source": SOURCE,
                "experiment": path.stem,
                "rejoin_step": int(m.group(1)) if m else None,
                "step": step,
                "wall_time": wall,
                "accuracy": acc,
            },
        )
    return pf


def _speed_names(path: Path) -> dict[int, str]:
    _, rows = read_csv_rows(path, NAMED_SPEED_COLUMNS)
    names = {}
    for r in rows:
        flops, params = to_float(r["Model FLOPs"]), to_float(r["Number of Parameters"])
        if flops is not None and params is not None:
            names[int(params)] = r["Model (temp)"].strip()
    return names


def import_cmdare_dir(store: Store, directory: str | Path) -> ImportResult:
    """Import every recognized CSV under CM-DARE's ``processed_data`` directory (one transaction).

    Raises:
        DataNotFoundError: the directory does not exist.
        DataFormatError: it does not look like CM-DARE's data, or a file has the wrong columns.
    """
    root = require_path(directory, "CM-DARE data directory")
    if not root.is_dir():
        raise DataFormatError(f"{root} is not a directory (expected CM-DARE's processed_data)")
    known = ("speed_data", "speed_and_cluster_size", "checkpoint", "startup_time", "chief_rejoining")
    if not any((root / k).is_dir() for k in known):
        raise DataFormatError(f"{root} does not look like CM-DARE's processed_data: none of {', '.join(known)}")
    parsed: list[ParsedFile] = []
    extra: list[FileResult] = []
    seen: set[Path] = set()

    def skipped_file(rel: str, reason: str) -> None:
        p = root / rel
        seen.add(p)
        n = max(sum(1 for _ in p.open(encoding="utf-8", errors="replace")) - 1, 0)
        extra.append(FileResult(str(p), "cmdare", "skipped", n, 0, {reason: n}))

    speed = root / "speed_data" / "0latency_data.csv"
    names = _speed_names(speed) if speed.exists() else {}
    for rel in ("speed_data/0latency_data.csv", "speed_data/speed_data_supertable.csv"):
        if (root / rel).exists():
            parsed.append(parse_speed_table(root / rel, names))
    for csv_path in sorted((root / "speed_data_base").glob("*/data.csv")):
        m = _BASE_DIR.match(csv_path.parent.name)
        if m:
            parsed.append(
                parse_tb_csv_speed(
                    csv_path,
                    "cmdare-speed-base",
                    f"{SOURCE}:speed_data_base",
                    None,
                    m.group(2),
                    m.group(1),
                    1,
                    1,
                )
            )
    for csv_path in sorted((root / "speed_and_cluster_size").glob("*/*/*.csv")):
        m = _CLUSTER_DIR.match(csv_path.parent.name)
        if m:
            gpu = m.group(2) if m.group(2).startswith(("k", "p")) else ("k80" if m.group(2) == "80" else "p100")
            model = "shakebig" if m.group(1) == "shakesbig" else m.group(1)
            parsed.append(
                parse_tb_csv_speed(
                    csv_path, "cmdare-cluster", f"{SOURCE}:cluster", None, gpu, model, int(m.group(4)),
                    int(m.group(3) or 1),
                )
            )
    whole = root / "checkpoint" / "whole_data.csv"
    if whole.exists():
        agg = root / "checkpoint" / "aggregated.csv"
        parsed.append(parse_checkpoints(whole, agg))
        if agg.exists():
            skipped_file("checkpoint/aggregated.csv", "aggregate of checkpoint/whole_data.csv (joined for #tensors)")
    for csv_path in sorted((root / "startup_time").glob("*/*.csv")):
        m = _STARTUP_DIR.match(csv_path.parent.name)
        if m:
            parsed.append(parse_startup(csv_path, transient=m.group(1) == "pre", region=m.group(2)))
    for csv_path in sorted((root / "chief_rejoining").glob("*.csv")):
        parsed.append(parse_rejoin(csv_path))
    for rel, reason in SKIP_AS.items():
        if (root / rel).exists():
            skipped_file(rel, reason)
    seen.update(pf.path for pf in parsed)
    for other in sorted(root.rglob("*.csv")):
        if other not in seen:
            skipped_file(str(other.relative_to(root)), "unrecognized file")
    return write_import(store, parsed, extra)
