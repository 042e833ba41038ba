"""Shared machinery of the importers: parsed files, bookkeeping, one transaction per import.

A parser turns one file into :class:`ParsedFile` (rows per table, rows read, rows skipped with a
reason each). :func:`write_import` then writes every parsed file in ONE transaction: a file whose
kind and content hash were imported before is skipped ("already imported"), so importing twice adds
nothing; any error rolls the whole import back, leaving the store unchanged.
"""

from __future__ import annotations

import csv
import hashlib
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cmdare.errors import DataFormatError, DataNotFoundError
from cmdare.measure.store import Store
from cmdare.measure.store.schema import Import, Run


@dataclass
class ParsedFile:
    """What a parser read from one file."""

    kind: str
    path: Path
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    read: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> rows
    ensure_runs: list[dict[str, Any]] = field(default_factory=list)  # run rows inserted if absent

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(table, []).append(row)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n

    @property
    def n_rows(self) -> int:
        return sum(len(v) for v in self.rows.values())


@dataclass
class FileResult:
    """Outcome of importing one file."""

    path: str
    kind: str
    status: str  # "imported", "already imported", "skipped"
    read: int
    imported: int
    skipped: dict[str, int]


@dataclass
class ImportResult:
    """Outcome of one import command: per-file results and totals."""

    files: list[FileResult] = field(default_factory=list)

    @property
    def read(self) -> int:
        return sum(f.read for f in self.files)

    @property
    def imported(self) -> int:
        return sum(f.imported for f in self.files)

    @property
    def skipped(self) -> int:
        return sum(sum(f.skipped.values()) for f in self.files)

    def reasons(self) -> Counter:
        total: Counter = Counter()
        for f in self.files:
            total.update(f.skipped)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "imported": self.imported,
            "skipped": self.skipped,
            "reasons": dict(self.reasons()),
            "files": [f.__dict__ for f in self.files],
        }


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def require_path(path: str | Path, what: str = "file") -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise DataNotFoundError(f"{what} not found: {p}")
    return p


def read_csv_rows(path: Path, required: Sequence[str]) -> tuple[list[str], list[dict[str, str]]]:
    """Rows of a CSV file as dicts; raises DataFormatError when a required column is missing."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            reader.fieldnames = header
            rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as err:
        raise DataFormatError(f"{path}: not a readable CSV file ({err})") from err
    missing = [c for c in required if c not in header]
    if missing:
        found = ", ".join(header) or "none"
        raise DataFormatError(f"{path}: missing column(s) {', '.join(missing)}; found {found}")
    return header, rows


def to_float(value: Any) -> float | None:
    """A finite float, or None for blanks and junk."""
    if value is None:
        return None
    s = str(value).strip()
    if not s:
        return None
    try:
        v = float(s)
    except ValueError:
        return None
    return v if v == v and v not in (float("inf"), float("-inf")) else None


def write_import(store: Store, parsed: Iterable[ParsedFile], extra: Iterable[FileResult] = ()) -> ImportResult:
    """Write parsed files in one transaction, skipping files already imported (same kind and hash)."""
    result = ImportResult(files=list(extra))
    with store.session() as session:
        for pf in parsed:
            digest = sha256_of(pf.path)
            skipped = dict(pf.skipped)
            done = session.execute(select(Import.id).where(Import.kind == pf.kind, Import.sha256 == digest)).first()
            if done is not None:
                result.files.append(
                    FileResult(str(pf.path), pf.kind, "already imported", pf.read, 0, {"already imported": pf.read})
                )
                continue
            rec = Import(
                kind=pf.kind,
                path=str(pf.path),
                sha256=digest,
                rows_read=pf.read,
                rows_imported=pf.n_rows,
                rows_skipped=sum(skipped.values()),
                imported_at=time.time(),
            )
            session.add(rec)
            for run in pf.ensure_runs:
                if session.get(Run, run["run_id"]) is None:
                    session.add(Run(import_id=None, **run))
            session.flush()
            for table, rows in pf.rows.items():
                for row in rows:
                    row["import_id"] = rec.id
                store.insert_rows(table, rows, session=session)
            result.files.append(FileResult(str(pf.path), pf.kind, "imported", pf.read, pf.n_rows, skipped))
    return result
