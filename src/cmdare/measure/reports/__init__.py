"""Characterization reports: each ``build(store, run_id=None) -> Report`` (tables, notes, a figure).

Registered by name in :data:`REPORTS`; :func:`build_report` looks one up.
"""

from __future__ import annotations

from collections.abc import Callable

from cmdare.errors import UnknownNameError
from cmdare.measure.reports import checkpoint, lifetimes, run, scaling, startup
from cmdare.measure.reports.base import FORMATS, Report
from cmdare.measure.store import Store

REPORTS: dict[str, Callable[..., Report]] = {
    "lifetimes": lifetimes.build,
    "scaling": scaling.build,
    "startup": startup.build,
    "checkpoint": checkpoint.build,
    "run": run.build,
}


def build_report(name: str, store: Store, run_id: str | None = None) -> Report:
    """Build the report ``name`` from the store (``run_id`` for ``run``, optional filter for others)."""
    try:
        builder = REPORTS[name]
    except KeyError:
        raise UnknownNameError("report", name, REPORTS) from None
    return builder(store, run_id=run_id)


__all__ = ["FORMATS", "REPORTS", "Report", "build_report"]
