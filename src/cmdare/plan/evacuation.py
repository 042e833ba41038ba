"""How long a parameter shard's evacuation pauses training, for the planner's spot-PS option.

An evacuation (``cmdare train --ps-transient``, :mod:`cmdare.train.ps.ps_evacuation`) moves a shard's
blocks with their momentum at an iteration boundary: the pause is a fixed part (quiescing, one
layout change on every worker) plus the bytes moved over the copy rate. :meth:`EvacuationModel.from_store`
fits both to the ``shard_evacuated`` events the store holds (the user's own runs); without three such
events the default stands, measured with ``bench/spot_ps.py`` on this project's 2-core machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_EVACUATION", "EvacuationModel", "ps_markets", "with_evacuation"]

FLOAT_BYTES = 4


@dataclass(frozen=True)
class EvacuationModel:
    """Pause of one shard evacuation: ``fixed_s + moved_bytes / bytes_per_s``."""

    fixed_s: float = 0.058
    bytes_per_s: float = 6.4e6
    source: str = "default: fit to 13 evacuations of bench/spot_ps.py (resnet15, 0.3-0.7 MB each, 2 cores)"
    events: int = 0

    def pause_s(self, moved_bytes: float) -> float:
        """Seconds training stands still while ``moved_bytes`` of blocks (with momentum) move."""
        return self.fixed_s + max(0.0, moved_bytes) / self.bytes_per_s

    def shard_pause_s(self, num_params: int, num_shards: int) -> float:
        """Pause of evacuating one of ``num_shards`` balanced shards of a ``num_params`` model (fp32 values
        and momentum)."""
        return self.pause_s(2 * FLOAT_BYTES * num_params / max(1, num_shards))

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]], source: str) -> EvacuationModel:
        """Least squares over ``(moved_bytes, pause_s)`` points (intercept and rate kept positive); fewer
        than three points, or a fit without a positive rate, keep the default."""
        if len(points) < 3:
            return DEFAULT_EVACUATION
        import numpy as np

        x, y = np.array(points, dtype=float).T
        slope, intercept = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (0.0, float(np.median(y)))
        if slope <= 0:  # pauses that do not grow with bytes: a fixed cost at the default rate
            return cls(max(0.0, float(np.median(y - x / DEFAULT_EVACUATION.bytes_per_s))),
                       DEFAULT_EVACUATION.bytes_per_s, source, len(points))
        return cls(max(0.0, float(intercept)), float(1.0 / slope), source, len(points))

    @classmethod
    def from_store(cls, url: str | None = None) -> EvacuationModel:
        """Fit to the store's ``shard_evacuated`` events; the default when the store has fewer than three
        (or cannot be opened)."""
        from sqlalchemy.exc import SQLAlchemyError

        from cmdare.errors import CmdareError
        from cmdare.measure.store import open_store

        try:
            store = open_store(url)
        except (CmdareError, SQLAlchemyError, OSError):
            return DEFAULT_EVACUATION
        try:
            events = store.frame("events", where=lambda c: c.kind == "shard_evacuated")
        finally:
            store.close()
        points = [(float(d.get("moved_bytes", 0)), float(d.get("pause_s", 0))) for d in events.get("details", [])
                  if isinstance(d, dict) and d.get("pause_s") is not None]
        return cls.fit(points, f"fit to {len(points)} evacuations in the store")


DEFAULT_EVACUATION = EvacuationModel()


def ps_markets(text: str) -> tuple[bool, ...]:
    """``--ps-market``: which PS markets a plan considers (False: on-demand, True: spot).

    Raises:
        UserInputError: not ``on-demand``, ``spot`` or ``any``.
    """
    from cmdare.errors import UserInputError

    choices = {"on-demand": (False,), "spot": (True,), "any": (False, True)}
    if text.strip().lower() not in choices:
        raise UserInputError(f"--ps-market must be one of {', '.join(choices)}, got {text!r}")
    return choices[text.strip().lower()]


def with_evacuation(models: Any, spot_ps: bool) -> Any:
    """``models`` (a :class:`~cmdare.plan.spec.PlanModels`) with spot PS servers' evacuation pause fitted to
    the store's own evacuations, when it has some (unchanged without spot PS)."""
    if not spot_ps:
        return models
    import dataclasses

    evacuation = EvacuationModel.from_store()
    return dataclasses.replace(models, evacuation=evacuation,
                               source=f"{models.source}; PS evacuation pause {evacuation.source}")
