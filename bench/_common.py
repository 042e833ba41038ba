"""Helpers shared by the benchmark scripts (run as ``python bench/NAME.py``, so ``bench/`` is on the path)."""

from __future__ import annotations

from typing import Any


def collector() -> Any:
    """A training callback that keeps every step, shard and event report (``.steps``, ``.shards``, ``.events``)."""
    from cmdare.train.callbacks import EventReport, ShardReport, StepReport, TrainCallback

    class Collect(TrainCallback):
        def __init__(self) -> None:
            self.steps: list[StepReport] = []
            self.shards: list[ShardReport] = []
            self.events: list[EventReport] = []

        def on_step(self, report: StepReport) -> None:
            self.steps.append(report)

        def on_shard(self, report: ShardReport) -> None:
            self.shards.append(report)

        def on_event(self, report: EventReport) -> None:
            self.events.append(report)

    return Collect()
