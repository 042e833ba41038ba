"""``cmdare runs``: the training runs the store recorded (status, steps, cost, where their checkpoints are), and
``cmdare runs show RUN``: one run's live status from its storage (the heartbeat the coordinator writes).

A run recorded as ``running`` whose last news (a step, an event, the heartbeat) is older than
:data:`~cmdare.train.run_control.STALE_AFTER_S` shows as ``stale``: it stopped without an end (killed, or
its machine lost).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from cmdare.errors import DataNotFoundError, UserInputError

__all__ = ["list_runs", "recorded_storage", "run_status", "runs_app"]

runs_app = typer.Typer(help="Training runs: list them (status, steps, cost, storage), or show one's live status.",
                       invoke_without_command=True)

_DB_OPTION = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: CMDARE_DB_URL or the data "
                          "directory's SQLite file).")
_JSON_OPTION = typer.Option(False, "--json", help="Print JSON.")


def _store(db: str | None) -> Any:
    from cmdare.measure.store import open_store

    return open_store(db)


def list_runs(store: Any, limit: int | None = None, now: float | None = None,
              run_id: str | None = None) -> list[dict[str, Any]]:
    """The store's cmdare runs (only ``run_id``, when given), newest first: id, status (``stale`` for a silent
    ``running`` one), model, dataset, step reached of the target, cost, accuracy, start time and storage."""
    from sqlalchemy import func, select

    from cmdare.measure.reports.run import shown_status
    from cmdare.measure.store.schema import Event, Run, StepMetric

    now = time.time() if now is None else now
    with store.session() as s:
        query = select(Run).where(Run.source == "cmdare").order_by(Run.started_at.desc())
        if run_id is not None:
            query = query.where(Run.run_id == run_id)
        runs = list(s.scalars(query.limit(limit) if limit else query))
        ids = [r.run_id for r in runs]
        last_step = dict(s.execute(select(StepMetric.run_id, func.max(StepMetric.global_step))
                                   .where(StepMetric.run_id.in_(ids)).group_by(StepMetric.run_id)).all())
        news: dict[str, float] = {}
        for table in (StepMetric, Event):
            for rid, t in s.execute(select(table.run_id, func.max(table.time)).where(table.run_id.in_(ids))
                                       .group_by(table.run_id)).all():
                news[rid] = max(news.get(rid, 0.0), float(t or 0.0))
        rows = []
        for r in runs:
            config = r.config or {}
            last = max(filter(None, (news.get(r.run_id), r.started_at)), default=None)
            step = r.final_step if r.final_step is not None else last_step.get(r.run_id)
            rows.append({"run_id": r.run_id, "status": shown_status(r.status, last, now), "model": r.model,
                         "dataset": r.dataset, "step": step, "steps": config.get("steps"),
                         "cost_usd": r.cost_usd, "accuracy": r.final_accuracy, "started_at": r.started_at,
                         "emulated": bool(r.emulated), "storage": _storage_shown(r.run_id, config)})
    return rows


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
    """Run ``run_id``'s status: its heartbeat in its storage (status, step, shards, age), the newest stored
    checkpoint, and what the store recorded. Raises DataNotFoundError when neither knows the run."""
    from cmdare.storage import run_storage
    from cmdare.train.checkpoint import CheckpointStore
    from cmdare.train.run_control import read_status

    where = run_storage(run_id, storage or recorded_storage(run_id, db))
    out: dict[str, Any] = {"run_id": run_id, "storage": where.uri}
    try:
        beat = read_status(where)
        out.update(status=beat.get("status"), global_step=beat.get("global_step"), shards=beat.get("num_shards"),
                   heartbeat_age_s=round(time.time() - float(beat.get("time", 0.0)), 1))
    except DataNotFoundError:
        pass
    steps = CheckpointStore(where).steps() if "status" in out or where.exists("run.json") else []
    out["latest_checkpoint_step"] = steps[-1] if steps else None
    recorded = next(iter(list_runs(_store(db), run_id=run_id)), None)  # this run's row, not every run's
    if recorded is not None:
        out.setdefault("status", recorded["status"])
        out.setdefault("global_step", recorded["step"])
        out.update({k: recorded[k] for k in ("model", "steps", "cost_usd", "accuracy", "emulated")})
    if "status" not in out:
        raise DataNotFoundError(f"no run {run_id}: not in the store, and no status file in {where.uri}")
    return out


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%m-%d %H:%M") if t else "-"


@runs_app.callback(invoke_without_command=True)
def runs_command(ctx: typer.Context,
                 limit: int = typer.Option(20, "--limit", help="Newest runs to list (0: all)."),
                 db: str | None = _DB_OPTION, as_json: bool = _JSON_OPTION) -> None:
    """List the recorded training runs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    if limit < 0:
        raise UserInputError(f"--limit must not be negative, got {limit}")
    rows = list_runs(_store(db), limit or None)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no runs recorded yet: `cmdare train` records one")
        return
    from rich import box
    from rich.table import Table

    from cmdare.console import console as make_console

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("run", "status", "model", "steps", "cost", "accuracy", "started"):
        table.add_column(col, justify="right" if col in ("steps", "cost", "accuracy") else "left", no_wrap=True)
    for r in rows:
        cost = f"${r['cost_usd']:.4f}{'*' if r['emulated'] else ''}" if r["cost_usd"] is not None else "-"
        table.add_row(r["run_id"], r["status"], r["model"] or "-", f"{r['step'] or 0}/{r['steps'] or '?'}", cost,
                      f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-", _when(r["started_at"]))
    console = make_console(soft_wrap=True)  # piped or captured: whole run ids, never an ellipsis
    console.print(table)
    if any(r["emulated"] for r in rows):
        console.print("* emulated servers, catalog prices", highlight=False)
    console.print("`cmdare runs show RUN`: a run's live status and where its checkpoints are", highlight=False)


@runs_app.command("show")
def runs_show(run: str = typer.Argument(..., help="Run id (see `cmdare runs`)."),
              storage: str | None = typer.Option(None, envvar="CMDARE_STORAGE",
                                                 help="The run's storage (default: as recorded)."),
              db: str | None = _DB_OPTION, as_json: bool = _JSON_OPTION) -> None:
    """One run's status: running (with its step and heartbeat), stale, finished or failed."""
    status = run_status(run, storage, db)
    if as_json:
        typer.echo(json.dumps(status, indent=2))
        return
    for key, value in status.items():
        typer.echo(f"{key.replace('_', ' ')}: {'-' if value is None else value}")


def export_cmd(run: str = typer.Argument(..., help="Run id (see `cmdare runs`)."),
               output: Path = typer.Option(..., "--output", "-o", help="The file to write (a new file unless "
                                                                        "--force)."),
               fmt: str = typer.Option("torch", "--format", help="torch (torch.save) or safetensors."),
               step: int | None = typer.Option(None, "--step", help="The checkpoint of this step (default: newest)."),
               storage: str | None = typer.Option(None, envvar="CMDARE_STORAGE",
                                                  help="The run's storage (default: as recorded)."),
               db: str | None = _DB_OPTION,
               force: bool = typer.Option(False, "--force", help="Replace an existing --output file (a symbolic "
                                                                 "link is replaced, never followed).")) -> None:
    """Write a run's trained model as a plain PyTorch state_dict (parameters and buffers)."""
    from cmdare.output_files import check_output, one_line
    from cmdare.storage import run_storage
    from cmdare.train.export import export_run

    check_output(output, "--output", force)  # before the run's storage is looked up
    done = export_run(run_storage(run, storage or recorded_storage(run, db)), output, fmt, step, force=force)
    # cmdare writes safetensors itself; reading it back needs the package, which cmdare does not install
    load = ("torch.load(FILE, weights_only=True)" if fmt == "torch" else
            "safetensors.torch.load_file(FILE) (pip install safetensors: cmdare wrote the file without it)")
    typer.echo(f"wrote {done.model} of {run} at step {done.step} to {one_line(done.path)}: {done.tensors} tensors, "
               f"{done.parameters:,} values; load with {load} into the model's load_state_dict")


def register(app: typer.Typer) -> None:
    """Add ``cmdare runs`` and ``cmdare export`` to the main app."""
    app.add_typer(runs_app, name="runs")
    app.command("export")(export_cmd)
