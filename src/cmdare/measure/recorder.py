"""The store recorder: a training callback that writes a run's measurements to the store.

Rows are buffered in memory and written in batches (one executemany per table), so a hook costs a
list append; a flush of ``batch_size`` rows costs a few milliseconds on SQLite. Staleness values are
folded into a per-worker histogram in memory and merged into the store with an upsert
(``count = count + excluded.count``), so several recorders of one run never lose counts.
If a write fails during training, the rows stay buffered and are retried at the next batch (up to
:data:`MAX_BACKLOG_BATCHES` batches), so a store hiccup does not stop a run; ``close()`` raises.
The recorder pickles (the store handle is reopened from its URL on first use after unpickling).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from typing import Any

from cmdare.errors import StoreError
from cmdare.events import (
    CheckpointReport,
    EvalReport,
    EventReport,
    RunInfo,
    RunSummary,
    ShardReport,
    StepReport,
    TrainCallback,
)
from cmdare.measure.part_rows import counts_of, end_part, start_part
from cmdare.measure.store import Store, open_store
from cmdare.measure.store.schema import Event, Run, Server, Staleness

log = logging.getLogger(__name__)
MAX_BACKLOG_BATCHES = 50  # rows kept in memory while the store is unreachable, in batches

# Event kinds that move a server through its life (column set on the server row).
_SERVER_PHASE = {
    "server_requested": "requested_at",
    "server_joined": "joined_at",
    "server_ended": "ended_at",
    "replacement_requested": "requested_at",
    "replacement_joined": "joined_at",
    "revocation": "ended_at",
    "worker_lost": "ended_at",
    "shard_lost": "ended_at",
}
_SERVER_FIELDS = (
    "role",
    "gpu_type",
    "region",
    "cloud",
    "transient",
    "price_per_hour_usd",
    "requested_at",
    "provisioned_at",
    "booted_at",
    "joined_at",
    "provisioning_s",
    "staging_s",
    "booting_s",
    "joining_s",
    "emulated",
)
#: What a resume overwrites when it starts; restored when it fails before training a step.
_RESULT_FIELDS = ("config", "status", "ended_at", "code_version", "emulated", "resumed_from_step", "final_step",
                  "final_accuracy", "final_loss", "steps_per_s", "cost_usd", "summary")


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))


class StoreRecorder(TrainCallback):
    """Records runs, steps, shards, evaluations, checkpoints, events and staleness in the store.

    Args:
        store_or_url: an open :class:`Store`, a SQLAlchemy URL, or None for the default store.
        batch_size: buffered rows (all tables together) that trigger a write.
    """

    def __init__(self, store_or_url: Store | str | None = None, batch_size: int = 200):
        self._store = store_or_url if isinstance(store_or_url, Store) else None
        self._url = store_or_url if isinstance(store_or_url, str) else None
        self._owns_store = self._store is None
        self.batch_size = max(1, int(batch_size))
        self._init_buffers()

    def _init_buffers(self) -> None:
        self._buf: dict[str, list[dict[str, Any]]] = {
            "step_metrics": [],
            "shard_metrics": [],
            "block_metrics": [],
            "eval_metrics": [],
            "checkpoints": [],
            "events": [],
        }
        self._pending = 0
        self._staleness: Counter = Counter()  # (run_id, worker_id, staleness) -> count
        self._server_updates: list[tuple[str, str, dict[str, Any]]] = []
        self._before_resume: dict[str, dict[str, Any]] = {}  # run id -> its recorded result, while a resume starts
        self._lock = threading.Lock()
        self.rows_written = 0

    def __getstate__(self) -> dict[str, Any]:
        state = {
            "_url": self._url
            or (self._store.engine.url.render_as_string(hide_password=False) if self._store else None),
            "batch_size": self.batch_size,
        }
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._store, self._url, self._owns_store = None, state["_url"], True
        self.batch_size = state["batch_size"]
        self._init_buffers()

    @property
    def store(self) -> Store:
        """The store (opened on first use)."""
        if self._store is None:
            self._store = open_store(self._url)
        return self._store

    # -- hooks -------------------------------------------------------------------------------------
    def on_run_start(self, info: RunInfo) -> None:
        cfg = _jsonable(dict(info.config))
        with self.store.session() as s:
            run = s.get(Run, info.run_id)
            if run is None:
                s.add(
                    Run(
                        run_id=info.run_id,
                        config=cfg,
                        model=_str(cfg.get("model")),
                        dataset=_str(cfg.get("dataset")),
                        status="running",
                        started_at=info.started_at,
                        code_version=info.code_version,
                        emulated=info.emulated,
                        resumed_from_step=info.resumed_from_step,
                        source="cmdare",
                    )
                )
            else:  # resume: keep the first start time, refresh the rest (kept aside: a resume that fails
                # before it trains a step must not overwrite what the run had recorded)
                self._before_resume[info.run_id] = {name: getattr(run, name) for name in _RESULT_FIELDS}
                run.config, run.status, run.ended_at = cfg, "running", None
                run.code_version, run.emulated = info.code_version, info.emulated
                run.resumed_from_step = info.resumed_from_step
            start_part(s, info, self._before_resume.get(info.run_id), run)

    def on_step(self, report: StepReport) -> None:
        row = {
            "run_id": report.run_id,
            "time": report.time,
            "global_step": report.global_step,
            "worker_id": report.worker_id,
            "steps": report.steps,
            "duration_s": report.duration_s,
            "loss": report.loss,
            "cluster_steps_per_s": report.cluster_steps_per_s,
            "compute_s": report.compute_s,
            "comm_s": report.comm_s,
        }
        with self._lock:
            self._buf["step_metrics"].append(row)
            if report.staleness:
                for value, n in Counter(report.staleness).items():
                    self._staleness[(report.run_id, report.worker_id, int(value))] += n
            self._pending += 1
        self._maybe_flush()

    def on_shard(self, report: ShardReport) -> None:
        self._add(
            "shard_metrics",
            {
                "run_id": report.run_id,
                "time": report.time,
                "global_step": report.global_step,
                "shard_id": report.shard_id,
                "pushes": report.pushes,
                "bytes_in": report.bytes_in,
                "bytes_out": report.bytes_out,
                "busy_s": report.busy_s,
                "num_params": report.num_params,
                "apply_s": report.apply_s,
                "queue_s": report.queue_s,
                "wait_s": report.wait_s,
            },
        )
        for b in report.blocks:
            self._add("block_metrics", {
                "run_id": report.run_id, "time": report.time, "global_step": report.global_step,
                "block_id": b.block_id, "shard_id": b.shard_id, "pushes": b.pushes, "bytes_in": b.bytes_in,
                "bytes_out": b.bytes_out, "apply_s": b.apply_s, "queue_s": b.queue_s, "wait_s": b.wait_s,
            })

    def on_eval(self, report: EvalReport) -> None:
        self._add(
            "eval_metrics",
            {
                "run_id": report.run_id,
                "time": report.time,
                "global_step": report.global_step,
                "worker_id": report.worker_id,
                "accuracy": report.accuracy,
                "loss": report.loss,
            },
        )

    def on_checkpoint(self, report: CheckpointReport) -> None:
        self._add(
            "checkpoints",
            {
                "run_id": report.run_id,
                "time": report.time,
                "step": report.global_step,
                "worker_id": report.worker_id,
                "path": report.path,
                "size_bytes": report.size_bytes,
                "num_tensors": report.num_tensors,
                "local_duration_s": report.duration_s,
                "remote_duration_s": None,
                "source": "cmdare",
            },
        )

    def on_event(self, report: EventReport) -> None:
        details = _jsonable(dict(report.details))
        self._add(
            "events",
            {
                "run_id": report.run_id,
                "time": report.time,
                "kind": report.kind,
                "global_step": report.global_step,
                "worker_id": report.worker_id,
                "shard_id": report.shard_id,
                "server_id": report.server_id,
                "details": details,
            },
        )
        if report.server_id:
            fields = {k: details[k] for k in _SERVER_FIELDS if k in details}
            column = _SERVER_PHASE.get(report.kind)
            if column:
                fields.setdefault(column, report.time)
                if column == "ended_at":
                    fields["end_reason"] = details.get("reason", report.kind)
            if fields:
                with self._lock:
                    self._server_updates.append((report.run_id, report.server_id, fields))

    def on_run_end(self, summary: RunSummary) -> None:
        self.flush()
        with self.store.session() as s:
            run = s.get(Run, summary.run_id)
            if run is None:
                run = Run(run_id=summary.run_id, config={}, started_at=summary.time - summary.wall_s)
                s.add(run)
            before = self._before_resume.pop(summary.run_id, None)
            totals = end_part(s, summary)
            if before is not None and summary.status != "finished" and summary.global_step <= run.resumed_from_step:
                for name, value in before.items():  # a failed resume: the run's recorded result stands
                    setattr(run, name, value)
                run.cost_usd = totals["cost_usd"]  # what the attempt cost is the run's cost too
                run.summary = _jsonable({**(run.summary or {}), **counts_of(totals)})
                s.add(Event(run_id=summary.run_id, time=summary.time, kind="resume_failed",
                            global_step=summary.global_step, details={"status": summary.status}))
                return
            run.status, run.ended_at, run.final_step = summary.status, summary.time, summary.global_step
            run.final_accuracy, run.final_loss = summary.final_accuracy, summary.final_loss
            run.steps_per_s = totals["steps_per_s"] if totals["steps_per_s"] is not None else summary.steps_per_s
            run.cost_usd = totals["cost_usd"]
            details = {k: v for k, v in summary.details.items() if k not in ("parts", "totals")}
            run.summary = _jsonable({**details, **counts_of(totals)})

    # -- writing -----------------------------------------------------------------------------------
    def _add(self, table: str, row: dict[str, Any]) -> None:
        with self._lock:
            self._buf[table].append(row)
            self._pending += 1
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._pending >= self.batch_size:
            try:
                self.flush()
            except StoreError as err:  # never stop training for the store: keep the rows, retry later
                if self._pending < self.batch_size * MAX_BACKLOG_BATCHES:
                    log.warning("recording delayed, store write failed (rows kept): %s", err)
                else:
                    raise

    def flush(self) -> int:
        """Write every buffered row now (one transaction); returns the rows written."""
        with self._lock:
            buf, self._buf = self._buf, {k: [] for k in self._buf}
            stale, self._staleness = self._staleness, Counter()
            servers, self._server_updates = self._server_updates, []
            self._pending = 0
        n = sum(len(v) for v in buf.values())
        if not n and not stale and not servers:
            return 0
        try:
            store = self.store
            with store.session() as s:
                for table, rows in buf.items():
                    store.insert_rows(table, rows, session=s)
                if stale:
                    _merge_staleness(store, s, stale)
                for run_id, server_id, fields in servers:
                    row = s.query(Server).filter_by(run_id=run_id, server_id=server_id).one_or_none()
                    if row is None:
                        row = Server(run_id=run_id, server_id=server_id, source="cmdare", **fields)
                        s.add(row)
                    else:
                        for k, v in fields.items():
                            setattr(row, k, v)
                    _fill_joining(row)
        except StoreError:
            with self._lock:  # the transaction rolled back: put everything back, in order
                for table, rows in buf.items():
                    self._buf[table][:0] = rows
                self._staleness.update(stale)
                self._server_updates[:0] = servers
                self._pending += n
            raise
        self.rows_written += n
        return n

    def close(self) -> None:
        """Flush and release the store if this recorder opened it."""
        self.flush()
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None


def _fill_joining(row: Server) -> None:
    """Joining = request-to-join time not spent provisioning, staging or booting (framework start)."""
    if row.joining_s is None and row.joined_at is not None and row.requested_at is not None:
        phases = sum(v or 0.0 for v in (row.provisioning_s, row.staging_s, row.booting_s))
        row.joining_s = max(row.joined_at - row.requested_at - phases, 0.0)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _merge_staleness(store: Store, session: Any, counts: Counter) -> None:
    rows = [{"run_id": r, "worker_id": w, "staleness": v, "count": c} for (r, w, v), c in counts.items()]
    table = Staleness.__table__
    if store.dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif store.dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - other databases: read-modify-write
        for row in rows:
            obj = (
                session.query(Staleness)
                .filter_by(run_id=row["run_id"], worker_id=row["worker_id"], staleness=row["staleness"])
                .one_or_none()
            )
            if obj is None:
                session.add(Staleness(**row))
            else:
                obj.count += row["count"]
        return
    stmt = insert(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=["run_id", "worker_id", "staleness"],
        set_={"count": table.c.count + stmt.excluded.count},
    )
    session.execute(stmt, rows)


def now_s() -> float:
    """Unix seconds (kept here so tests and benches share one clock)."""
    return time.time()
