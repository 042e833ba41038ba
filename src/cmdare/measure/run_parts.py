"""A run's parts and its totals: one set of counts across resumes.

A run is trained in parts: its first ``cmdare train`` and each ``cmdare train --resume RUN`` after it, under the
same run id. A part has its own start, end, steps (``from_step`` to ``to_step``; a resume with ``--from-step``
goes back and trains some steps again), wall time, servers' cost, revocations and replacements. The run's
figures in all are the sums over its parts (its step is the last part's): the end-of-run summary, ``cmdare
runs``, ``cmdare runs show`` and ``cmdare report run`` all show these, and only these.

A part that stopped without an end (its driver killed, its machine lost) keeps what was known of it: its start,
its last step from the heartbeat, and ``None`` (unknown) for what only its end reports (cost, revocations).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["ENDLESS", "UNKNOWN", "RunPart", "merge_parts", "parts_from", "run_totals"]

#: The status of a part that stopped without an end (killed, or its machine lost).
ENDLESS = "stopped without an end"
#: The status of a part trained before cmdare kept parts (a run resumed after an upgrade): only its steps known.
UNKNOWN = "unknown"


@dataclass
class RunPart:
    """One part of a run (see the module's doc); ``None``: not known (a part still running, or one without an
    end)."""

    part: int  # 1, 2, ... in the order the parts started
    started_at: float | None
    status: str = "running"
    from_step: int = 0
    to_step: int | None = None
    ended_at: float | None = None
    wall_s: float | None = None
    steps_per_s: float | None = None
    cost_usd: float | None = None
    revocations: int | None = None
    replacements: int | None = None
    time_lost_s: float | None = None
    emulated: bool = False

    @property
    def steps_trained(self) -> int:
        """Global steps this part advanced the run by (0 while unknown)."""
        return max(0, (self.to_step if self.to_step is not None else self.from_step) - self.from_step)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the fields)."""
        return asdict(self)


_FIELDS = {f.name for f in fields(RunPart)}


def parts_from(rows: Iterable[Mapping[str, Any] | RunPart]) -> list[RunPart]:
    """:class:`RunPart` objects from dicts (``parts.json``, a store row) or parts, ordered by part; unknown keys
    are ignored, so a newer file reads with an older cmdare."""
    out = [r if isinstance(r, RunPart) else RunPart(**{k: v for k, v in dict(r).items() if k in _FIELDS})
           for r in rows]
    return sorted(out, key=lambda p: p.part)


def merge_parts(known: Iterable[Mapping[str, Any] | RunPart],
                newer: Iterable[Mapping[str, Any] | RunPart]) -> list[RunPart]:
    """The parts of ``newer`` (the run's storage, as its drivers wrote them), each field it does not know
    (``None``, an ``unknown`` status) taken from its twin in ``known`` (the store's rows): the part that started
    at the same time, or for a part whose start is unknown, the one of the same number and first step."""
    known = parts_from(known)
    out = []
    for part in parts_from(newer):
        twin = next((k for k in known if (k.started_at == part.started_at if part.started_at is not None
                                          else (k.part, k.from_step) == (part.part, part.from_step))), None)
        if twin is not None:
            for name in _FIELDS:
                if getattr(part, name) is None or (name == "status" and part.status == UNKNOWN):
                    setattr(part, name, getattr(twin, name))
        out.append(part)
    return out


def _total(parts: list[RunPart], name: str) -> Any:
    known = [getattr(p, name) for p in parts if getattr(p, name) is not None]
    return sum(known) if known else None


def run_totals(parts: Iterable[Mapping[str, Any] | RunPart]) -> dict[str, Any]:
    """The run in all: ``parts``, ``global_step`` (the last part's), ``steps_trained``, ``wall_s``, ``cost_usd``,
    ``revocations``, ``replacements``, ``time_lost_s`` (sums over the parts that know them), ``steps_per_s``
    (steps trained over the time spent training them, each part's at its own speed) and ``unknown_parts``: the
    parts whose cost and counts are not known (running, or stopped without an end)."""
    parts = parts_from(parts)
    trained = sum(p.steps_trained for p in parts)
    train_s = sum(p.steps_trained / p.steps_per_s for p in parts if p.steps_per_s)
    last = parts[-1] if parts else None
    return {
        "parts": len(parts),
        "global_step": (last.to_step if last.to_step is not None else last.from_step) if last else 0,
        "steps_trained": trained,
        "wall_s": _total(parts, "wall_s"),
        "steps_per_s": trained / train_s if train_s > 0 else None,
        "cost_usd": _total(parts, "cost_usd"),
        "revocations": _total(parts, "revocations"),
        "replacements": _total(parts, "replacements"),
        "time_lost_s": _total(parts, "time_lost_s"),
        "unknown_parts": [p.part for p in parts if p.cost_usd is None],
    }
