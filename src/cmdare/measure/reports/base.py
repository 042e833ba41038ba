"""The report type every characterization report returns, and its renderers (table, CSV, JSON, PNG)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cmdare.errors import StoreError, UnknownNameError, UserInputError

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("table", "csv", "json")


@dataclass
class Report:
    """Tables (the first is the main one), notes (findings in words) and a figure builder."""

    name: str
    title: str
    tables: dict[str, pd.DataFrame]
    notes: list[str] = field(default_factory=list)
    plot: Callable[[Any], None] | None = None  # draws on a matplotlib Figure
    figsize: tuple[float, float] = (12.0, 4.5)

    @property
    def main(self) -> pd.DataFrame:
        return next(iter(self.tables.values()))

    def to_dict(self) -> dict[str, Any]:
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if hasattr(v, "item"):
                return clean(v.item())
            return v

        return {
            "report": self.name,
            "title": self.title,
            "notes": self.notes,
            "tables": {
                k: [{c: clean(v) for c, v in row.items()} for row in df.to_dict("records")]
                for k, df in self.tables.items()
            },
        }

    def render(self, fmt: str = "table", table: str | None = None) -> str:
        """The report as text: Rich tables (with notes), CSV or JSON; every table, or only ``table``.

        CSV of several tables: each under a ``# NAME`` line, a blank line between (one table: plain CSV).
        """
        if fmt not in FORMATS:
            raise UnknownNameError("report format", fmt, FORMATS)
        if table is not None:
            if table not in self.tables:
                raise UnknownNameError(f"{self.name} report table", table, list(self.tables))
            return Report(self.name, self.title, {table: self.tables[table]}, self.notes).render(fmt)
        if fmt == "csv":
            if len(self.tables) == 1:
                return self.main.to_csv(index=False)
            return "\n".join(f"# {name}\n{df.to_csv(index=False)}" for name, df in self.tables.items())
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=1)
        return _rich_text(self)

    def save_plot(self, path: str | Path, force: bool = False) -> Path:
        """Draw the figure into a PNG file (Agg backend; another format by the file's suffix), written as
        :func:`cmdare.output_files.open_output` writes: never over an existing file unless ``force``."""
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        from cmdare.output_files import check_figure_output, save_figure

        if self.plot is None:
            raise UserInputError(f"report {self.name!r} has no plot")
        out = check_figure_output(path, "--plot", force)
        fig = plt.figure(figsize=self.figsize)
        try:
            self.plot(fig)
            fig.suptitle(self.title)
            fig.tight_layout()
            save_figure(fig, out, "--plot", force, dpi=100)
        finally:
            plt.close(fig)
        return out


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def _rich_text(report: Report) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    from cmdare.console import console as make_console

    buf = StringIO()  # as wide as stdout: the terminal's width, or no limit when piped (nothing cut)
    console = Console(file=buf, width=make_console().width, force_terminal=False)
    for name, df in report.tables.items():
        table = Table(title=f"{report.title}: {name}" if len(report.tables) > 1 else report.title)
        for col in df.columns:
            table.add_column(str(col))
        for row in df.itertuples(index=False):
            table.add_row(*[_fmt(v) for v in row])
        console.print(table)
    for note in report.notes:
        console.print(f"- {note}", highlight=False)
    return buf.getvalue()


def require_rows(df: pd.DataFrame, what: str, store_url: str, how: str) -> None:
    """Raise a one-line error naming the import to run when the store has no rows for a report."""
    if df.empty:
        from cmdare.errors import DataNotFoundError

        raise DataNotFoundError(f"no {what} in the store {store_url}; import them first: {how}")


__all__ = ["FORMATS", "Report", "StoreError", "require_rows"]
