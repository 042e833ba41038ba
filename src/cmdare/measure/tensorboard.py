"""TensorBoard: a training callback writing scalars, and the importer of event files.

Scalars written by :class:`TensorBoardCallback`: ``global_step/sec`` (cluster steps/s), ``loss``,
``accuracy`` and ``checkpoint_s``, all against the global step, so users see cmdare runs in
TensorBoard and ``cmdare import tensorboard LOGDIR --run NAME`` can bring them back into the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cmdare.events import CheckpointReport, EvalReport, RunSummary, StepReport, TrainCallback


class TensorBoardCallback(TrainCallback):
    """Writes ``global_step/sec``, ``loss``, ``accuracy`` and ``checkpoint_s`` with a SummaryWriter."""

    def __init__(self, logdir: str | Path, flush_secs: int = 30):
        self.logdir = str(logdir)
        self.flush_secs = flush_secs
        self._writer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"logdir": self.logdir, "flush_secs": self.flush_secs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    @property
    def writer(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.logdir, flush_secs=self.flush_secs)
        return self._writer

    def on_step(self, report: StepReport) -> None:
        w = self.writer
        w.add_scalar("global_step/sec", report.cluster_steps_per_s, report.global_step, walltime=report.time)
        w.add_scalar("loss", report.loss, report.global_step, walltime=report.time)

    def on_eval(self, report: EvalReport) -> None:
        for name, value in (report.metrics or {"accuracy": report.accuracy}).items():
            if value is not None:
                self.writer.add_scalar(name, value, report.global_step, walltime=report.time)
        if report.accuracy is None:  # your own task: its test loss is what shows progress
            self.writer.add_scalar("test_loss", report.loss, report.global_step, walltime=report.time)

    def on_checkpoint(self, report: CheckpointReport) -> None:
        self.writer.add_scalar("checkpoint_s", report.duration_s, report.global_step, walltime=report.time)

    def on_run_end(self, summary: RunSummary) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
