"""A run's parts in the store (table ``run_parts``, :mod:`cmdare.measure.run_parts`): the recorder starts a part
when a run starts or resumes and ends it with the run's summary; reports and ``cmdare runs`` read them back.

A part's figures come from the driver's summary; when the summary lists every part (the run's storage keeps
them, so a resume on another machine or into another store knows the parts before it), the store's rows are
replaced by that list, each field it does not know filled from the store's own row of that part.
"""

from __future__ import annotations

from typing import Any

from cmdare.events import RunInfo, RunSummary
from cmdare.measure.run_parts import UNKNOWN, RunPart, merge_parts, run_totals
from cmdare.measure.store.schema import Run, RunPartRow

__all__ = ["counts_of", "end_part", "part_rows", "row_part", "start_part"]


def part_rows(session: Any, run_id: str) -> list[RunPartRow]:
    """Run ``run_id``'s part rows, in order."""
    return list(session.query(RunPartRow).filter_by(run_id=run_id).order_by(RunPartRow.part))


def row_part(row: RunPartRow) -> RunPart:
    """A part row as a :class:`RunPart`."""
    return RunPart(**{name: getattr(row, name) for name in RunPart.__dataclass_fields__})


def start_part(session: Any, info: RunInfo, before: dict[str, Any] | None, run: Run | None) -> None:
    """A part row for the run starting: part 1 of a new run (a start from step 0 under a known id trains the run
    anew: its old parts go), else the next part; a run recorded before parts were kept gets its recorded result
    as part 1 first."""
    rows = part_rows(session, info.run_id)
    if info.resumed_from_step == 0:
        for row in rows:
            session.delete(row)
        rows = []
    elif not rows and before is not None and run is not None:
        summary = before.get("summary") or {}
        rows = [RunPartRow(run_id=info.run_id, part=1, started_at=run.started_at,
                           status=before.get("status") or UNKNOWN, from_step=before.get("resumed_from_step") or 0,
                           to_step=before.get("final_step"), ended_at=before.get("ended_at"),
                           wall_s=summary.get("wall_s"), steps_per_s=before.get("steps_per_s"),
                           cost_usd=before.get("cost_usd"), revocations=summary.get("revocations"),
                           replacements=summary.get("replacements"), time_lost_s=summary.get("time_lost_s"),
                           emulated=bool(before.get("emulated")))]
        session.add(rows[0])
    session.flush()
    session.add(RunPartRow(run_id=info.run_id, part=max((r.part for r in rows), default=0) + 1,
                           started_at=info.started_at, status="running", from_step=info.resumed_from_step,
                           emulated=info.emulated))


def end_part(session: Any, summary: RunSummary) -> dict[str, Any]:
    """The part that ends, in the store's part rows (with every part its storage lists, when the summary carries
    them); returns the run's totals over its parts."""
    rows = part_rows(session, summary.run_id)
    mine = next((r for r in reversed(rows) if r.status == "running"), None)
    figures = {"status": summary.status, "to_step": summary.global_step, "ended_at": summary.time,
               "wall_s": summary.wall_s, "steps_per_s": summary.steps_per_s, "cost_usd": summary.cost_usd,
               "revocations": summary.revocations, "replacements": summary.replacements,
               "time_lost_s": summary.details.get("time_lost_s")}
    if mine is None:  # no start heard: the part is the run's only one known here
        mine = RunPartRow(run_id=summary.run_id, part=max((r.part for r in rows), default=0) + 1,
                          started_at=summary.time - summary.wall_s, status="running", from_step=0,
                          emulated=bool(summary.details.get("emulated")))
        session.add(mine)
        rows.append(mine)
    for name, value in figures.items():
        setattr(mine, name, value)
    parts = [row_part(r) for r in rows]
    if summary.details.get("parts"):  # the driver's list: every part, also those this store never saw
        parts = merge_parts(parts, summary.details["parts"])
        for row in rows:
            session.delete(row)
        session.flush()
        for part in parts:
            session.add(RunPartRow(run_id=summary.run_id, **part.to_dict()))
    return run_totals(parts)


def counts_of(totals: dict[str, Any]) -> dict[str, Any]:
    """The run's counts in all, for its summary (the sums over its parts)."""
    return {"revocations": totals["revocations"] or 0, "replacements": totals["replacements"] or 0,
            "wall_s": totals["wall_s"], "time_lost_s": totals["time_lost_s"], "parts": totals["parts"],
            "steps_trained": totals["steps_trained"], "unknown_parts": totals["unknown_parts"]}
