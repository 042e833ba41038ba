"""Importer of transient-server lifetime data.

Formats (detected from the content):

- the GCE GPU lifetime spreadsheet export (ICAC 2019, ``gce_gpu_lifetimes.csv``): sections ``K80``,
  ``P100``, ``V100`` with ``VM name,Start,Terminate`` rows (``2/18/19 23:40``), the zone inside the VM
  name and a ``less`` suffix for idle VMs; then ``Previous experiments``: per-day blocks (``8-May``) of
  time-of-day pairs (a terminate before the start wrapped past midnight), optionally under zone lines;
  ``gpuN`` VMs are labelled ``gpu`` (type not recorded) and ``testN`` VMs ``unlabeled``;
- the preemption JSON of Kadupitiya et al. (``gce_cpu_preemptions.json``): one object per VM with
  ``instance_data``, ``time_in_sec``, ``insert`` and either ``compute.instances.preempted`` (revoked) or
  ``stop`` (stopped by the experimenters: a right-censored lifetime);
- a plain CSV with a ``lifetime_s`` column (optional ``preempted``, ``server_type``, ``zone``, ``idle``).

Spreadsheet times carry no time zone; they are stored as if UTC. Every GCE-ended VM counts as
preempted (the 24 h deadline stop is a revocation too); ``preempted=False`` marks censored lifetimes.
"""

from __future__ import annotations

import csv
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cmdare.errors import DataFormatError
from cmdare.measure.importers.common import ImportResult, ParsedFile, require_path, to_float, write_import
from cmdare.measure.store import Store

GPU_SECTIONS = {"k80": "k80", "p100": "p100", "v100": "v100"}
PREVIOUS_SECTION = "previous experiments"
# The "Previous experiments" blocks (May-June) are 2019: some of their cells are spreadsheet serial times
# written as hours since 1899-12-30, and those decode to May 2019.
PREVIOUS_YEAR = 2019
SHEET_EPOCH = datetime(1899, 12, 30, tzinfo=UTC)
_HMS = re.compile(r"^(\d+):(\d{2}):(\d{2})$")
_ZONE = re.compile(r"((?:us|europe|asia|northamerica|southamerica|australia|me|africa)-[a-z]+\d+-[a-z])")
_DAY = re.compile(r"^(\d{1,2})-([A-Za-z]{3})$")
_MONTHS = {
    m: i
    for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], start=1)
}


def _region_of(zone: str | None) -> str | None:
    return zone.rsplit("-", 1)[0] if zone else None


def _obs(
    source: str,
    name: str,
    server_type: str,
    start: datetime | None,
    end: datetime | None,
    lifetime_s: float,
    preempted: bool,
    zone: str | None = None,
    idle: bool | None = None,
    machine_type: str | None = None,
    hour: int | None = None,
) -> dict[str, Any]:
    if hour is None and end is not None:
        hour = end.hour
    return {
        "source": source,
        "name": name,
        "server_type": server_type,
        "machine_type": machine_type,
        "region": _region_of(zone),
        "zone": zone,
        "idle": idle,
        "start": start.timestamp() if start else None,
        "end": end.timestamp() if end else None,
        "lifetime_s": float(lifetime_s),
        "preempted": bool(preempted),
        "hour_of_day": hour,
    }


def _time_pair(a: str, b: str, day: tuple[int, int] | None) -> tuple[datetime, datetime] | None:
    """Start and end of a "Previous experiments" row: time-of-day on ``day`` (end wraps past
    midnight), or spreadsheet serial hours (``1046389:24:27``) when the hour field exceeds 23."""
    ma, mb = _HMS.match(a), _HMS.match(b)
    if not ma or not mb:
        return None
    ha, hb = int(ma.group(1)), int(mb.group(1))
    if ha > 23 and hb > 23:
        start = SHEET_EPOCH + timedelta(hours=ha, minutes=int(ma.group(2)), seconds=int(ma.group(3)))
        end = SHEET_EPOCH + timedelta(hours=hb, minutes=int(mb.group(2)), seconds=int(mb.group(3)))
        return start, end
    if day is None or day[0] == 0 or ha > 23 or hb > 23:
        return None
    try:
        t0 = datetime.strptime(a, "%H:%M:%S").time()
        t1 = datetime.strptime(b, "%H:%M:%S").time()
    except ValueError:
        return None
    base = datetime(PREVIOUS_YEAR, day[0], day[1]).date()
    start, end = datetime.combine(base, t0, tzinfo=UTC), datetime.combine(base, t1, tzinfo=UTC)
    if end < start:
        end += timedelta(days=1)
    return start, end


def parse_gce_csv(path: Path) -> ParsedFile:
    """The GCE GPU lifetime spreadsheet export (see the module docstring)."""
    pf = ParsedFile("lifetimes-gce-csv", path)
    source = "icac2019-gce-gpu"
    section: str | None = None
    day: tuple[int, int] | None = None
    zone_line: str | None = None
    seen: set[tuple] = set()
    with path.open(newline="", encoding="utf-8-sig") as fh:
        for cells in csv.reader(fh):
            cells = [c.strip() for c in cells] + ["", "", ""]
            first, a, b = cells[0], cells[1], cells[2]
            if not any(cells):
                continue
            low = first.lower()
            if not a and not b:  # a section, day or zone line
                if low in GPU_SECTIONS or low == PREVIOUS_SECTION:
                    section, day, zone_line = low, None, None
                elif _DAY.match(first):
                    m = _DAY.match(first)
                    day, zone_line = (_MONTHS.get(m.group(2).lower(), 0), int(m.group(1))), None
                elif _ZONE.fullmatch(low):
                    zone_line = low
                continue
            if low == "vm name" or a.lower() in ("start", "created"):
                m = _DAY.match(first)
                if m:
                    day, zone_line = (_MONTHS.get(m.group(2).lower(), 0), int(m.group(1))), None
                continue
            pf.read += 1
            if section is None:
                pf.skip("row before any section header")
                continue
            key = (section, day, zone_line, first, a, b)
            if key in seen:
                pf.skip("duplicate row")
                continue
            seen.add(key)
            idle = "less" in low
            if section in GPU_SECTIONS:
                try:
                    start = datetime.strptime(a, "%m/%d/%y %H:%M").replace(tzinfo=UTC)
                    end = datetime.strptime(b, "%m/%d/%y %H:%M").replace(tzinfo=UTC)
                except ValueError:
                    pf.skip("unparseable start/terminate time")
                    continue
                m = _ZONE.search(low)
                stype, zone = GPU_SECTIONS[section], m.group(1) if m else None
            else:
                pair = _time_pair(a, b, day)
                if pair is None:
                    pf.skip("unparseable start/terminate time")
                    continue
                start, end = pair
                stype = "gpu" if low.startswith("gpu") else "unlabeled"
                zone = zone_line
            life = (end - start).total_seconds()
            if life <= 0:
                pf.skip("terminate not after start")
                continue
            pf.add("lifetime_observations", _obs(source, first, stype, start, end, life, True, zone, idle))
    if pf.read == 0:
        raise DataFormatError(f"{path}: no lifetime rows found (expected GCE sections or a lifetime_s column)")
    return pf


def _iso(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None


def parse_preemption_json(path: Path) -> ParsedFile:
    """The 1,442-VM preemption JSON (Kadupitiya et al., HPDC 2020)."""
    pf = ParsedFile("lifetimes-gce-json", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}: invalid or truncated JSON ({err.msg} at line {err.lineno})") from err
    except UnicodeDecodeError as err:
        raise DataFormatError(f"{path}: not a UTF-8 JSON file") from err
    if not isinstance(data, dict):
        raise DataFormatError(f"{path}: expected a JSON object of VMs keyed by name")
    for name, vm in data.items():
        pf.read += 1
        if not isinstance(vm, dict) or not isinstance(vm.get("instance_data"), dict):
            pf.skip("entry without instance_data")
            continue
        life = to_float(vm.get("time_in_sec"))
        if life is None or life < 0:
            pf.skip("missing or negative time_in_sec")
            continue
        inst = vm["instance_data"]
        preempted = "compute.instances.preempted" in vm
        end_op = vm.get("compute.instances.preempted") or vm.get("stop") or {}
        start = _iso((vm.get("insert") or {}).get("insertTime"))
        end = _iso(end_op.get("startTime") or end_op.get("insertTime"))
        hour = vm.get("hr_of_day")
        pf.add(
            "lifetime_observations",
            _obs(
                "hpdc2020-gce-cpu",
                str(inst.get("NAME", name)),
                "cpu",
                start,
                end,
                life,
                preempted,
                inst.get("ZONE"),
                vm.get("idle_vs_nonidle") == "idle",
                inst.get("MACHINE_TYPE"),
                int(hour) if isinstance(hour, int | float) else None,
            ),
        )
    return pf


def parse_plain_csv(path: Path) -> ParsedFile:
    """A CSV with ``lifetime_s`` (optional ``preempted``, ``server_type``, ``zone``, ``idle``)."""
    pf = ParsedFile("lifetimes-csv", path)
    with path.open(newline="", encoding="utf-8-sig") as fh:
        for row in csv.DictReader(fh):
            pf.read += 1
            life = to_float(row.get("lifetime_s"))
            if life is None or life < 0:
                pf.skip("missing or negative lifetime_s")
                continue
            flag = str(row.get("preempted", "true")).strip().lower()
            idle = str(row.get("idle", "")).strip().lower()
            pf.add(
                "lifetime_observations",
                _obs(
                    f"csv:{path.name}",
                    row.get("name") or None,
                    (row.get("server_type") or "unlabeled").lower(),
                    None,
                    None,
                    life,
                    flag not in ("0", "false", "no", "n"),
                    row.get("zone") or None,
                    {"true": True, "1": True, "false": False, "0": False}.get(idle),
                ),
            )
    return pf


def read_lifetimes_file(path: str | Path) -> ParsedFile:
    """Parse one lifetime file, detecting its format (see the module docstring).

    Raises:
        DataNotFoundError: no such file.
        DataFormatError: unknown layout, wrong columns or truncated JSON.
    """
    p = require_path(path, "lifetime file")
    if p.is_dir():
        raise DataFormatError(f"{p} is a directory; name a lifetime CSV or JSON file")
    with p.open("rb") as fh:
        head = fh.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if p.suffix.lower() == ".json" or head.startswith(("{", "[")):
        return parse_preemption_json(p)
    first = head.splitlines()[0].lower() if head else ""
    if "lifetime_s" in [c.strip() for c in first.split(",")]:
        return parse_plain_csv(p)
    if first.split(",")[0].strip() in GPU_SECTIONS or "vm name" in first:
        return parse_gce_csv(p)
    raise DataFormatError(
        f"{p}: unknown lifetime format; expected a lifetime_s column, the GCE lifetime sheet "
        f"(K80/P100/V100 sections) or the preemption JSON; first line: {first[:80]!r}"
    )


def import_lifetimes(store: Store, paths: list[str | Path]) -> ImportResult:
    """Import lifetime files in one transaction (idempotent: a file imported before is skipped)."""
    parsed = [read_lifetimes_file(p) for p in paths]
    return write_import(store, parsed)
