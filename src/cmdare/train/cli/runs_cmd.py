"""``cmdare runs``: the training runs the store recorded (status, steps, cost, where their checkpoints are), and
``cmdare runs show RUN``: one run's live status from its storage (the heartbeat the coordinator writes).

Both decide a run's status and step by one rule (:func:`live_state`): a run whose end was recorded shows that
end and its final step; a run without an end shows its heartbeat's status (``stale`` when the heartbeat is
older than :data:`~cmdare.train.runtime.run_files.STALE_AFTER_S` or its driver's process is gone: killed, or its
machine lost) and the step it trained to, the newer of the heartbeat's and the store's; without a heartbeat
to read, the store's news decides (``stale`` after :data:`~cmdare.measure.reports.run.STALE_AFTER_S`). A run's
cost and counts are its parts' sums (:mod:`cmdare.measure.run_parts`): the first training and each resume.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Any

import typer

from cmdare.errors import DataNotFoundError, UserInputError

__all__ = ["count_runs", "list_runs", "live_state", "recorded_storage", "run_status", "runs_app"]

runs_app = typer.Typer(help="Training runs: list them (status, steps, cost, storage), or show one's live status.",
                       invoke_without_command=True)

DB_OPTION = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: CMDARE_DB_URL or the data "
                          "directory's SQLite file).")
_JSON_OPTION = typer.Option(False, "--json", help="Print JSON.")
DEFAULT_LIMIT = 20  # runs `cmdare runs` lists without --limit or --all


def _store(db: str | None) -> Any:
    from cmdare.measure.store import open_store

    return open_store(db)


def list_runs(store: Any, limit: int | None = None, now: float | None = None, run_id: str | None = None,
              beats: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The store's cmdare runs (only ``run_id``, when given), newest first: id, status and step by
    :func:`live_state`, model, dataset, target steps, the run's cost and counts over its parts, accuracy, start
    time and storage. ``beats``: heartbeats already read, by run id (else a running run's is read from where it
    was recorded to keep its files)."""
    from sqlalchemy import func, select

    from cmdare.measure.part_rows import row_part
    from cmdare.measure.store.schema import Event, Run, RunPartRow, StepMetric

    now = time.time() if now is None else now
    with store.session() as s:
        query = select(Run).where(Run.source == "cmdare").order_by(Run.started_at.desc())
        if run_id is not None:
            query = query.where(Run.run_id == run_id)
        runs = list(s.scalars(query.limit(limit) if limit else query))
        ids = [r.run_id for r in runs]
        parts: dict[str, list[Any]] = {}
        for row in s.scalars(select(RunPartRow).where(RunPartRow.run_id.in_(ids)).order_by(RunPartRow.part)):
            parts.setdefault(row.run_id, []).append(row_part(row))
        news: dict[str, float] = {}
        for table in (StepMetric, Event):
            for rid, t in s.execute(select(table.run_id, func.max(table.time)).where(table.run_id.in_(ids))
                                       .group_by(table.run_id)).all():
                news[rid] = max(news.get(rid, 0.0), float(t or 0.0))
        rows = []
        for r in runs:
            config = r.config or {}
            since = parts[r.run_id][-1].started_at if parts.get(r.run_id) else None  # this part's steps only
            stored = s.execute(select(func.max(StepMetric.global_step)).where(
                StepMetric.run_id == r.run_id, StepMetric.time >= (since or 0.0))).scalar() \
                if r.status == "running" else None
            last = max(filter(None, (news.get(r.run_id), r.started_at)), default=None)
            beat = (beats or {}).get(r.run_id) or (_heartbeat(r.run_id, config) if r.status == "running" else None)
            state = live_state(r.status, r.ended_at, r.final_step, stored, last, beat, now)
            rows.append({"run_id": r.run_id, **state, "model": r.model, "dataset": r.dataset,
                         "steps": config.get("steps"), **_counts(r, parts.get(r.run_id, [])),
                         "accuracy": r.final_accuracy, "loss": r.final_loss, "started_at": r.started_at,
                         "emulated": bool(r.emulated), "storage": _storage_shown(r.run_id, config)})
    return rows


def count_runs(store: Any) -> int:
    """How many cmdare runs the store holds."""
    from sqlalchemy import func, select

    from cmdare.measure.store.schema import Run

    with store.session() as s:
        return int(s.execute(select(func.count()).select_from(Run).where(Run.source == "cmdare")).scalar_one())


def live_state(recorded: str | None, ended_at: float | None, final_step: int | None, stored_step: int | None,
               last_news: float | None, beat: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """A run's ``status``, ``step`` (trained to) and ``step_source``, one rule for ``runs`` and ``runs show``: the
    recorded end (status and final step) unless a heartbeat is newer; else the heartbeat's status (its stale
    rules applied by :func:`~cmdare.train.runtime.run_files.read_status`) and the newer of its step and the store's;
    without a heartbeat, the store's status rule and step."""
    from cmdare.measure.reports.run import shown_status

    if recorded not in (None, "running") and (beat is None or beat.get("status") not in ("running", "stale")
                                              or float(beat.get("time", 0.0)) <= (ended_at or 0.0)):
        return {"status": recorded, "step": final_step, "step_source": "the run's end"}
    if beat is not None:
        age = max(0.0, now - float(beat.get("time", 0.0)))
        step, source = beat.get("global_step"), f"heartbeat {age:.0f} s ago"
        if stored_step is not None and (step is None or stored_step > step):
            step, source = stored_step, "the store"
        return {"status": beat.get("status"), "step": step, "step_source": source, "heartbeat_age_s": round(age, 1)}
    return {"status": shown_status(recorded or "running", last_news, now), "step": stored_step,
            "step_source": "the store"}


def _heartbeat(run_id: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The run's ``status.json`` (where it was recorded to keep its files), or None when it cannot be read."""
    from cmdare.storage import as_storage, run_storage
    from cmdare.train.runtime.run_files import read_status

    try:
        where = config.get("checkpoint_dir") or run_storage(run_id, config.get("storage"))
        return read_status(as_storage(where))
    except Exception:  # noqa: BLE001 - no status file, an unreachable or unknown storage: the store decides
        return None


def _counts(run: Any, parts: list[Any]) -> dict[str, Any]:
    """The run's cost and counts over its parts (a run recorded before parts were kept: its own row)."""
    from cmdare.measure.run_parts import run_totals

    if not parts:
        summary = run.summary or {}
        return {"cost_usd": run.cost_usd, "revocations": summary.get("revocations"),
                "replacements": summary.get("replacements"), "wall_s": summary.get("wall_s"), "parts": 1,
                "unknown_parts": [], "part_list": []}
    totals = run_totals(parts)
    return {"cost_usd": totals["cost_usd"], "revocations": totals["revocations"],
            "replacements": totals["replacements"], "wall_s": totals["wall_s"], "parts": totals["parts"],
            "unknown_parts": totals["unknown_parts"], "part_list": [p.to_dict() for p in parts]}


def recorded_storage(run_id: str, db: str | None = None) -> str | None:
    """The ``--storage`` run ``run_id`` was recorded with, when the store knows it and it holds no masked
    password (a password is stored nowhere: such a run needs ``--storage`` again); else None."""
    from cmdare.measure.store import open_store
    from cmdare.measure.store.schema import Run
    from cmdare.paths import default_db_url

    url = db or default_db_url()
    if url.startswith("sqlite:///") and not os.path.exists(url.removeprefix("sqlite:///")):
        return None  # no store on this machine: nothing recorded (and none created)
    try:
        store = open_store(url, migrate_schema=False)
    except Exception:  # noqa: BLE001 - no store here: nothing recorded
        return None
    try:
        with store.session() as s:
            run = s.get(Run, run_id)
            storage = (run.config or {}).get("storage") if run is not None else None
    finally:
        store.close()
    return storage if isinstance(storage, str) and storage and "***" not in storage else None


def _storage_shown(run_id: str, config: dict[str, Any]) -> str:
    from cmdare.storage import run_storage

    storage = config.get("storage")
    try:
        return run_storage(run_id, storage).uri
    except Exception:  # noqa: BLE001 - a storage this machine cannot open (a missing fsspec backend)
        return f"{storage}/{run_id}" if storage else "?"


def run_status(run_id: str, storage: str | None, db: str | None = None) -> dict[str, Any]:
    """Run ``run_id``'s status and step by :func:`live_state` (the rule of ``cmdare runs``), its shards, the newest
    stored checkpoint, its parts and what the store recorded. Raises DataNotFoundError when neither its storage
    nor the store knows the run."""
    from cmdare.storage import run_storage
    from cmdare.train.duties.checkpoint import CheckpointStore
    from cmdare.train.runtime.run_files import read_status

    where = run_storage(run_id, storage or recorded_storage(run_id, db))
    out: dict[str, Any] = {"run_id": run_id, "storage": where.uri}
    try:
        beat: dict[str, Any] | None = read_status(where)
    except DataNotFoundError:
        beat = None
    beats = {run_id: beat} if beat is not None else None
    recorded = next(iter(list_runs(_store(db), run_id=run_id, beats=beats)), None)  # this run's row only
    if recorded is None and beat is None:
        raise DataNotFoundError(f"no run {run_id}: not in the store, and no status file in {where.uri}")
    state = (recorded if recorded is not None else live_state(None, None, None, None, None, beat, time.time()))
    out.update(status=state["status"], global_step=state["step"], step_source=state["step_source"])
    if beat is not None:
        out.update(shards=beat.get("num_shards"), heartbeat_age_s=round(time.time() - float(beat.get("time", 0.0)), 1))
    steps = CheckpointStore(where).steps() if beat is not None or where.exists("run.json") else []
    out["latest_checkpoint_step"] = steps[-1] if steps else None
    if recorded is not None:
        out.update({k: recorded[k] for k in ("model", "steps", "cost_usd", "revocations", "replacements", "wall_s",
                                             "parts", "unknown_parts", "accuracy", "loss", "emulated", "part_list")})
    return out


#: How ``runs show`` names its fields (the rest: the key, with spaces).
_LABELS = {"global_step": "trained to step", "latest_checkpoint_step": "stored step (newest checkpoint, where a "
           "resume continues)", "cost_usd": "cost in all", "revocations": "revocations in all",
           "replacements": "replacements in all", "wall_s": "wall time in all (s)",
           "loss": "test loss", "accuracy": "test accuracy"}


def _show_lines(status: dict[str, Any]) -> list[str]:
    """``runs show``'s text: one line per field, the trained step with its source, then one line per part."""
    lines = []
    for key, value in status.items():
        if key in ("step_source", "part_list", "unknown_parts") or (key in ("accuracy", "loss") and value is None):
            continue
        shown = ("-" if value is None else f"{value:.4f}" if key == "cost_usd" else f"{value:.1f}" if key == "wall_s"
                 else f"{value:.4g}" if key in ("accuracy", "loss") else value)
        if key == "global_step" and value is not None:
            shown = f"{value} (from {status.get('step_source')})"
        if key == "cost_usd" and status.get("unknown_parts"):
            shown = f"{shown} (part {', '.join(map(str, status['unknown_parts']))} not priced: running, or stopped " \
                    "without an end)"
        lines.append(f"{_LABELS.get(key, key.replace('_', ' '))}: {shown}")
    for p in status.get("part_list") or []:
        cost = f"${p['cost_usd']:.4f}" if p["cost_usd"] is not None else "cost not known"
        counts = (f"{p['revocations']} revoked, {p['replacements']} replaced"
                  if p["revocations"] is not None else "counts not known")
        wall = f"{p['wall_s']:.1f} s" if p["wall_s"] is not None else "time not known"
        to = p["to_step"] if p["to_step"] is not None else "?"
        state = status["status"] if p["status"] == "running" else p["status"]  # the run's rule: maybe stale
        lines.append(f"  part {p['part']}: steps {p['from_step']}-{to}, {state}, {wall}, {counts}, {cost}")
    return lines


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%m-%d %H:%M") if t else "-"


@runs_app.callback(invoke_without_command=True)
def runs_command(ctx: typer.Context,
                 limit: int = typer.Option(DEFAULT_LIMIT, "--limit", help="Newest runs to list (0: all)."),
                 show_all: bool = typer.Option(False, "--all", help="List every run (as --limit 0)."),
                 db: str | None = DB_OPTION, as_json: bool = _JSON_OPTION) -> None:
    """List the recorded training runs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    if limit < 0:
        raise UserInputError(f"--limit must not be negative, got {limit}")
    store = _store(db)
    rows = list_runs(store, None if show_all else limit or None)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no runs recorded yet: `cmdare train` records one")
        return
    total = count_runs(store)
    from rich import box
    from rich.table import Table

    from cmdare.console import console as make_console

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("run", "status", "model", "steps", "parts", "cost", "accuracy", "started"):
        table.add_column(col, justify="right" if col in ("steps", "parts", "cost", "accuracy") else "left",
                         no_wrap=True)
    for r in rows:
        cost = (f"${r['cost_usd']:.4f}{'+' if r['unknown_parts'] else ''}{'*' if r['emulated'] else ''}"
                if r["cost_usd"] is not None else "-")
        table.add_row(r["run_id"], r["status"], r["model"] or "-", f"{r['step'] or 0}/{r['steps'] or '?'}",
                      str(r["parts"]), cost, f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-",
                      _when(r["started_at"]))
    console = make_console(soft_wrap=True)  # piped or captured: whole run ids, never an ellipsis
    console.print(table)
    if len(rows) < total:
        console.print(f"showing {len(rows)} of {total} runs; --all / --limit N", highlight=False)
    if any(r["unknown_parts"] for r in rows):
        console.print("+ and parts not priced yet (running, or stopped without an end)", highlight=False)
    if any(r["emulated"] for r in rows):
        console.print("* emulated servers: catalog prices over emulated cloud time", highlight=False)
    console.print("steps, cost: the run in all, over its parts (a run and its resumes); `cmdare runs show RUN`: a "
                  "run's live status, its parts and where its checkpoints are", highlight=False)


@runs_app.command("show")
def runs_show(run: str = typer.Argument(..., help="Run id (see `cmdare runs`)."),
              storage: str | None = typer.Option(None, envvar="CMDARE_STORAGE",
                                                 help="The run's storage (default: as recorded)."),
              db: str | None = DB_OPTION, as_json: bool = _JSON_OPTION) -> None:
    """One run's status: running (with its step and heartbeat), stale, finished or failed."""
    status = run_status(run, storage, db)
    if as_json:
        typer.echo(json.dumps(status, indent=2))
        return
    for line in _show_lines(status):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add ``cmdare runs`` to the main app."""
    app.add_typer(runs_app, name="runs")
