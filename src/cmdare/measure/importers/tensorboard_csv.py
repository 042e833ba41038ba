"""TensorBoard scalar CSV exports (``Wall time,Step,Value``)."""

from __future__ import annotations

from pathlib import Path

from cmdare.measure.importers.common import ParsedFile, read_csv_rows, to_float

TB_COLUMNS = ("Wall time", "Step", "Value")


def read_tb_csv(path: Path) -> list[tuple[float | None, int, float] | str]:
    """Rows ``(wall_time, step, value)`` of an export; a malformed row becomes its skip reason (str)."""
    _, rows = read_csv_rows(path, TB_COLUMNS)
    out: list[tuple[float | None, int, float] | str] = []
    for row in rows:
        step, value = to_float(row.get("Step")), to_float(row.get("Value"))
        if step is None or value is None:
            out.append("missing or non-numeric Step/Value")
            continue
        out.append((to_float(row.get("Wall time")), int(step), value))
    return out


def parse_tb_csv_speed(
    path: Path,
    kind: str,
    source: str,
    run_id: str | None,
    gpu_type: str | None,
    model_name: str | None,
    workers: int,
    ps: int,
) -> ParsedFile:
    """A ``global_step/sec`` export as cluster speed samples (non-positive speeds are skipped)."""
    pf = ParsedFile(kind, path)
    for item in read_tb_csv(path):
        pf.read += 1
        if isinstance(item, str):
            pf.skip(item)
            continue
        wall, step, value = item
        if value <= 0:
            pf.skip("non-positive steps/s (run start)")
            continue
        pf.add(
            "cluster_speed_samples",
            {
                "source": source,
                "run_id": run_id,
                "gpu_type": gpu_type,
                "model_name": model_name,
                "workers": workers,
                "ps": ps,
                "step": step,
                "wall_time": wall,
                "steps_per_s": value,
            },
        )
    return pf
