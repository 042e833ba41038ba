"""``cmdare report run RUN_ID``: one run's throughput over time, events, cost so far, each worker's server
(GPU type, price), speed and staleness, push staleness and parameter-shard load (service, queueing and
worker-observed wait per push), and its parts (a run and its resumes, :mod:`cmdare.measure.run_parts`): the
summary's cost, counts, steps and time are the run's in all, the sums over its parts. A run of your own model
shows its test loss and metrics where a built-in dataset's shows its accuracy."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from cmdare.errors import DataNotFoundError, UserInputError
from cmdare.events import is_replacement, is_revocation
from cmdare.measure.part_rows import part_rows, row_part
from cmdare.measure.reports.base import Report
from cmdare.measure.reports.run_workers import workers_table
from cmdare.measure.run_parts import run_totals
from cmdare.measure.store import Store
from cmdare.measure.store.schema import Run

MARKED = {
    "revocation": "red",
    "worker_lost": "red",
    "notice": "orange",
    "replacement_joined": "green",
    "chief_change": "purple",
    "checkpoint": "gray",
    "ps_move": "blue",
}
BINS = 40
MAX_WORKER_LINES = 8  # a run with more workers plots staleness per GPU type
# What the plot's legend calls each marked event.
EVENT_WORDS = {"revocation": "server revoked", "worker_lost": "worker lost", "notice": "preemption notice",
               "replacement_joined": "replacement joined", "chief_change": "new chief", "ps_move": "blocks moved"}


def _cost_usd(servers: Any, run: Run, now: float, parts_cost: float | None = None) -> float | None:
    if parts_cost or run.cost_usd:
        return float(parts_cost or run.cost_usd)
    priced = servers[servers.price_per_hour_usd.notna()] if not servers.empty else servers
    if priced.empty:
        return None
    start = priced.joined_at.fillna(priced.requested_at).fillna(run.started_at or now)
    end = priced.ended_at.fillna(run.ended_at or now)
    return float(((end - start).clip(lower=0) / 3600 * priced.price_per_hour_usd).sum())


def _quantile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """The ``q`` quantile of a histogram (``counts`` pushes had staleness ``values``)."""
    order = np.argsort(values)
    cum = np.cumsum(counts[order])
    return float(values[order][min(np.searchsorted(cum, q * cum[-1]), len(cum) - 1)])


def staleness_table(hist: Any) -> Any:
    """Per-worker push staleness (pushes, mean, P50, P95, max) from the ``staleness`` histogram rows,
    plus an ``all`` row; empty when the run recorded none."""
    import pandas as pd

    cols = ["worker_id", "pushes", "mean", "p50", "p95", "max"]
    if hist is None or not len(hist):
        return pd.DataFrame(columns=cols)
    rows = []
    groups = [(str(int(w)), part) for w, part in hist.groupby("worker_id")] + [("all", hist)]
    for worker, part in groups:
        part = part.groupby("staleness", as_index=False)["count"].sum()
        v, c = part["staleness"].to_numpy(float), part["count"].to_numpy(float)
        rows.append({"worker_id": worker, "pushes": int(c.sum()), "mean": round(float((v * c).sum() / c.sum()), 3),
                     "p50": _quantile(v, c, 0.5), "p95": _quantile(v, c, 0.95), "max": float(v.max())})
    return pd.DataFrame(rows, columns=cols)


def shard_table(shards: Any) -> Any:
    """Per shard over the run: pushes, MB in/out, and per push the service time, the queueing delay and
    the workers' wait (ms); empty when the run recorded no shard load."""
    import pandas as pd

    cols = ["shard_id", "pushes", "mb_in", "mb_out", "service_ms", "queue_ms", "wait_ms"]
    if shards is None or not len(shards) or shards.pushes.sum() == 0:
        return pd.DataFrame(columns=cols)
    g = shards.fillna({"queue_s": 0.0, "wait_s": 0.0}).groupby("shard_id", as_index=False).sum(numeric_only=True)
    g = g[g.pushes > 0]
    per = 1000.0 / g.pushes
    return pd.DataFrame({"shard_id": g.shard_id.astype(int), "pushes": g.pushes.astype(int),
                         "mb_in": (g.bytes_in / 1e6).round(1), "mb_out": (g.bytes_out / 1e6).round(1),
                         "service_ms": (g.busy_s * per).round(2), "queue_ms": (g.queue_s * per).round(2),
                         "wait_ms": (g.wait_s * per).round(2)}, columns=cols)


def _emulation_notes(run: Run, servers: Any) -> list[str]:
    """Say when the run's servers were emulated: GPU types, prices and start-up phases are not measured."""
    n = int(servers.emulated.astype(bool).sum()) if len(servers) else 0
    if not run.emulated and not n:
        return []
    of = f"{n} of {len(servers)} servers" if len(servers) else "its servers"
    return [f"emulated run: {of} were local stand-ins for cloud VMs; their GPU type and price are the "
            "catalog's (cost_usd is what those servers would cost), their start-up phases emulated (drawn "
            "from the startup model, or fixed by --startup), and revocations, if any, injected"]


def build(store: Store, run_id: str | None = None) -> Report:
    """The report of one run (throughput, events, checkpoints, cost)."""
    import pandas as pd

    if not run_id:
        raise UserInputError("report run needs a RUN_ID (see the runs table)")
    with store.session() as s:
        run = s.get(Run, run_id)
        if run is None:
            recent = [r.run_id for r in s.query(Run).order_by(Run.started_at.desc()).limit(5)]
            hint = f"; recent runs: {', '.join(recent)}" if recent else "; the store has no runs"
            raise DataNotFoundError(f"no run {run_id!r} in the store {store.url}{hint}")
    steps = store.frame("step_metrics", where=lambda c: c.run_id == run_id, order_by=("time",))
    events = store.frame("events", where=lambda c: c.run_id == run_id, order_by=("time",))
    ckpts = store.frame("checkpoints", where=lambda c: c.run_id == run_id, order_by=("time",))
    evals = store.frame("eval_metrics", where=lambda c: c.run_id == run_id, order_by=("time",))
    servers = store.frame("servers", where=lambda c: c.run_id == run_id)
    stale_hist = store.frame("staleness", where=lambda c: c.run_id == run_id)
    stale_df = staleness_table(stale_hist)
    shard_df = shard_table(store.frame("shard_metrics", where=lambda c: c.run_id == run_id))
    t0 = run.started_at or (float(steps.time.min()) if len(steps) else 0.0)
    now = run.ended_at or (float(steps.time.max()) if len(steps) else time.time())
    speed = steps[steps.cluster_steps_per_s.notna()]
    timeline = pd.DataFrame(columns=["t_s", "global_step", "cluster_steps_per_s", "loss"])
    if len(speed):
        edges = np.linspace(speed.time.min(), speed.time.max() + 1e-9, min(BINS, len(speed)) + 1)
        idx = np.clip(np.digitize(speed.time, edges) - 1, 0, len(edges) - 2)
        timeline = (
            speed.assign(bin=idx)
            .groupby("bin", as_index=False)
            .agg(
                t_s=("time", "max"),
                global_step=("global_step", "max"),
                cluster_steps_per_s=("cluster_steps_per_s", "mean"),
                loss=("loss", "mean"),
            )
        )
        timeline["t_s"] = timeline.t_s - t0
        timeline = timeline.drop(columns="bin")
    kinds = events.kind.value_counts().to_dict() if len(events) else {}
    with store.session() as s:
        parts = [row_part(r) for r in part_rows(s, run_id)]
    totals = run_totals(parts) if parts else None
    summary = {
        "run_id": run.run_id,
        "model": run.model,
        "dataset": run.dataset,
        "status": shown_status(run.status, _last_news(run, steps, events), time.time()),
        "emulated": run.emulated,
        "emulated_servers": int(servers.emulated.astype(bool).sum()) if len(servers) else 0,
        "global_step": int(run.final_step or (steps.global_step.max() if len(steps) else 0)),
        "parts": len(parts) or 1,
        "steps_trained": totals["steps_trained"] if totals else None,
        "wall_s": float(totals["wall_s"]) if totals and totals["wall_s"] is not None else float(now - t0),
        "steps_per_s": totals["steps_per_s"] if totals and totals["steps_per_s"] is not None else run.steps_per_s,
        "revocations": _count(totals, "revocations", int(sum(is_revocation(e.kind, e.details)
                                                             for e in events.itertuples())) if len(events) else 0),
        "replacements": _count(totals, "replacements", int(sum(n for k, n in kinds.items() if is_replacement(k)))),
        "checkpoints": len(ckpts),
        **_test_results(run, evals),
        "cost_usd": _cost_usd(servers, run, now, totals["cost_usd"] if totals else None),
        "staleness_mean": float(stale_df["mean"].iloc[-1]) if len(stale_df) else None,
        "lr_changes": int(kinds.get("lr_change", 0)),
    }
    if totals and totals["unknown_parts"]:
        summary["parts_not_priced"] = ", ".join(map(str, totals["unknown_parts"]))
    summary = {k: v for k, v in summary.items() if v is not None}  # your own task: no accuracy; an old run: no parts
    summary_df = pd.DataFrame({"field": list(summary), "value": [str(v) for v in summary.values()]})
    parts_df = pd.DataFrame([p.to_dict() for p in parts]).drop(columns=["emulated"], errors="ignore")
    notes = _emulation_notes(run, servers)
    decided = events[events.kind == "decision"] if len(events) else events
    events = events[events.kind != "decision"] if len(events) else events
    event_df = (
        events[["time", "kind", "global_step", "worker_id", "server_id"]]
        .assign(t_s=lambda d: d.time - t0)
        .drop(columns="time")
        if len(events)
        else pd.DataFrame()
    )
    decision_df = decisions_table(decided, t0)

    workers_df = workers_table(steps, events, servers, stale_df)
    gpu_of = {int(r.worker_id): str(r.gpu_type).upper() if isinstance(r.gpu_type, str) else "?"
              for r in workers_df.itertuples()} if len(workers_df) else {}

    def plot(fig: Any) -> None:
        if len(stale_hist):
            from matplotlib.ticker import MaxNLocator

            ax, ax_stale = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
            hist = stale_hist.assign(gpu=stale_hist.worker_id.map(lambda w: gpu_of.get(int(w), "?")))
            per_worker = hist.worker_id.nunique() <= MAX_WORKER_LINES  # else one line per GPU type
            groups = hist.groupby("worker_id" if per_worker else "gpu")
            for k, (key, part) in enumerate(groups):
                part = part.groupby("staleness", as_index=False)["count"].sum().sort_values("staleness")
                share = part["count"] / part["count"].sum()
                label = f"worker {key} ({gpu_of.get(int(key), '?')})" if per_worker else \
                    f"{key} workers ({hist[hist.gpu == key].worker_id.nunique()})"
                ax_stale.plot(part["staleness"], share, "o-", ms=3, color=f"C{k % 10}", label=label)
            ax_stale.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax_stale.set(xlabel="push staleness (global steps since the pull)", ylabel="fraction of pushes",
                         title=f"Push staleness (mean {stale_df['mean'].iloc[-1]:.2f} steps)")
            ax_stale.legend(fontsize=7)
        else:
            ax = fig.subplots(1, 1)
        if len(speed):
            ax.plot(speed.time - t0, speed.cluster_steps_per_s, ".", ms=2, alpha=0.3, color="C0")
            ax.plot(timeline.t_s, timeline.cluster_steps_per_s, "-", color="C0", label="cluster steps/s")
        seen = set()
        for ev in events.itertuples():
            color = MARKED.get(ev.kind)
            if color:
                ax.axvline(ev.time - t0, color=color, ls="--", lw=1,
                           label=None if ev.kind in seen else EVENT_WORDS.get(ev.kind, ev.kind))
                seen.add(ev.kind)
        for ck in ckpts.itertuples():
            if ck.time is not None and "checkpoint" not in seen:
                ax.axvline(ck.time - t0, color="gray", ls=":", lw=1, label="checkpoint")
                seen.add("checkpoint")
            elif ck.time is not None:
                ax.axvline(ck.time - t0, color="gray", ls=":", lw=1)
        cost = summary["cost_usd"]
        ax.set(
            xlabel="time since the run started (s)",
            ylabel="cluster speed (global steps/s)",
            title="Training speed and events" + (f" (cost so far ${cost:.4f})" if cost is not None else ""),
        )
        ax.legend(fontsize=8, loc="best")

    return Report(
        "run",
        f"Run {run_id}",
        {"summary": summary_df, "parts": parts_df, "timeline": timeline, "events": event_df,
         "decisions": decision_df, "workers": workers_df, "staleness": stale_df, "shards": shard_df},
        notes,
        plot,
        figsize=(15, 4.5) if len(stale_hist) else (11, 4.5),
    )


def decisions_table(decided: Any, t0: float) -> Any:
    """The run controller's decisions (``decision`` events, all but the feeding of workers): when, at which step,
    what (the command), for which worker, and why."""
    import pandas as pd

    cols = ["t_s", "global_step", "command", "worker_id", "why"]
    if not len(decided):
        return pd.DataFrame(columns=cols)
    details = decided.details.map(lambda d: d if isinstance(d, dict) else {})
    return pd.DataFrame({"t_s": decided.time - t0, "global_step": decided.global_step,
                         "command": details.map(lambda d: d.get("command", "?")), "worker_id": decided.worker_id,
                         "why": details.map(lambda d: d.get("why", ""))}).reset_index(drop=True)


def _count(totals: dict[str, Any] | None, name: str, from_events: int) -> int:
    """A count of the run in all: the sum over its parts, or (a run recorded before parts were kept, or whose
    parts do not know it) what its events say."""
    return int(totals[name]) if totals and totals[name] is not None else from_events


def _test_results(run: Run, evals: Any) -> dict[str, Any]:
    """The run's final test results: accuracy where the task measures one (a built-in dataset), else None; the
    test loss, and the metrics of your own task (``test_metrics``), from the run's end or its last evaluation."""
    def last(column: str) -> float | None:
        known = evals[column].dropna() if len(evals) else evals
        return float(known.iloc[-1]) if len(known) else None

    accuracy = run.final_accuracy if run.final_accuracy is not None else last("accuracy")
    loss = run.final_loss if run.final_loss is not None else last("loss")
    metrics = (run.summary or {}).get("test_metrics") or {}
    shown = ", ".join(f"{k} {float(v):.4g}" for k, v in metrics.items() if isinstance(v, int | float))
    return {"final_accuracy": accuracy, "final_loss": loss, "test_metrics": shown or None}


#: A run still ``running`` in the store with nothing recorded for this long stopped without an end (killed, or
#: its machine lost): the recorder writes at least every few hundred steps, and a step takes seconds at most.
STALE_AFTER_S = 1800.0


def shown_status(status: str, last_news: float | None, now: float) -> str:
    """The status to show: ``stale`` for a ``running`` run with no news for :data:`STALE_AFTER_S`."""
    if status == "running" and last_news is not None and now - last_news > STALE_AFTER_S:
        return "stale"
    return status


def _last_news(run: Any, steps: Any, events: Any) -> float | None:  # a Run row and two DataFrames
    times = [t for t in (run.started_at, steps.time.max() if len(steps) else None,
                         events.time.max() if len(events) else None) if t is not None]
    return float(max(times)) if times else None
