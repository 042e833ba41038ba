"""Measurement hooks of the training loop.

The coordinator calls these hooks; recorders (the SQLAlchemy store, TensorBoard, the progress bar)
are callbacks, not code woven into the loop. The report types and :class:`TrainCallback` live in
:mod:`cmdare.events` (so lower layers can use them); this is the place users import them from.
"""

from __future__ import annotations

from cmdare.events import (
    EVENT_KINDS,
    CheckpointReport,
    EvalReport,
    EventReport,
    RunInfo,
    RunSummary,
    ShardReport,
    StepReport,
    TrainCallback,
    is_replacement,
    is_revocation,
)

__all__ = [
    "EVENT_KINDS",
    "CheckpointReport",
    "EvalReport",
    "EventReport",
    "RunInfo",
    "RunSummary",
    "ShardReport",
    "StepReport",
    "TrainCallback",
    "is_replacement",
    "is_revocation",
]
