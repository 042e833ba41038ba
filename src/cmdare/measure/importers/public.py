"""The public measurements into a store: on ``cmdare import public``, or on first use by a report.

The data is the copy bundled in :mod:`cmdare.public_data` (or ``$CMDARE_SHARED_DATA``, or a folder
the user names). Imports are idempotent, so importing on first use never adds rows twice.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from cmdare.measure.importers.cmdare_data import import_cmdare_dir
from cmdare.measure.importers.common import ImportResult
from cmdare.measure.importers.lifetimes import import_lifetimes
from cmdare.measure.store import Store
from cmdare.measure.store.schema import Import
from cmdare.public_data import LIFETIME_FILES, public_data_dir

__all__ = ["REPORT_KINDS", "ensure_public_data", "import_public"]

# The import kinds each characterization report is built on.
REPORT_KINDS: dict[str, tuple[str, ...]] = {
    "lifetimes": ("lifetimes-gce-csv", "lifetimes-gce-json"),
    "scaling": ("cmdare-cluster",),
    "startup": ("cmdare-startup",),
    "checkpoint": ("cmdare-checkpoint",),
}


def import_public(store: Store, root: str | Path | None = None) -> tuple[ImportResult, ImportResult]:
    """Import CM-DARE's measurements and both lifetime files from ``root`` (default: the public data).

    Returns the results of the CM-DARE import and of the lifetime import.
    """
    base = Path(root).expanduser() if root is not None else public_data_dir()
    cmdare = import_cmdare_dir(store, base / "cmdare")
    lifetimes = import_lifetimes(store, [base / "lifetimes" / name for name in LIFETIME_FILES])
    return cmdare, lifetimes


def ensure_public_data(store: Store, report: str) -> ImportResult | None:
    """Import the public data when ``report`` needs it and the store has never imported it.

    Returns what was imported, or None when nothing was needed.
    """
    kinds = REPORT_KINDS.get(report)
    if not kinds:
        return None
    with store.session() as session:
        done = session.execute(select(func.count(Import.id)).where(Import.kind.in_(kinds))).scalar_one()
    if done:
        return None
    cmdare, lifetimes = import_public(store)
    return ImportResult(files=cmdare.files + lifetimes.files)
