"""The per-worker table of ``cmdare report run``: each worker's server (GPU type, price), speed and staleness."""

from __future__ import annotations

from typing import Any

__all__ = ["workers_table"]

_COLUMNS = ["worker_id", "server_id", "gpu_type", "price_per_hour_usd", "emulated", "steps", "steps_per_s",
            "staleness_mean"]


def workers_table(steps: Any, events: Any, servers: Any, staleness: Any) -> Any:
    """One row per worker that trained: its server (from its join event), the steps it pushed, its own
    speed (steps over the time its chunks took) and its mean push staleness; empty without steps."""
    import pandas as pd

    if not len(steps):
        return pd.DataFrame(columns=_COLUMNS)
    per = steps.groupby("worker_id").agg(steps=("steps", "sum"), busy_s=("duration_s", "sum")).reset_index()
    per["steps_per_s"] = (per.steps / per.busy_s.where(per.busy_s > 0)).round(3)
    joins = events[events.kind.isin(["server_joined", "replacement_joined"]) & events.worker_id.notna()] \
        if len(events) else pd.DataFrame(columns=["worker_id", "server_id"])
    server_of = joins.drop_duplicates("worker_id").set_index("worker_id")["server_id"].to_dict()
    per["server_id"] = per.worker_id.map(server_of)
    if len(servers):
        info = servers.drop_duplicates("server_id").set_index("server_id")
        for col in ("gpu_type", "price_per_hour_usd", "emulated"):
            per[col] = per.server_id.map(info[col].to_dict())
    else:
        per[["gpu_type", "price_per_hour_usd", "emulated"]] = None
    if len(staleness):
        stale = staleness[staleness.worker_id != "all"].set_index("worker_id")["mean"].to_dict()
        per["staleness_mean"] = per.worker_id.map(lambda w: stale.get(str(int(w))))
    else:
        per["staleness_mean"] = None
    per["worker_id"] = per.worker_id.astype(int)
    return per[_COLUMNS].sort_values("worker_id").reset_index(drop=True)
