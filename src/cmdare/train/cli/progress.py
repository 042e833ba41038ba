"""A Rich progress bar as a training callback: step, steps/s, training loss, the last test evaluation
(``train loss 0.008  test acc 0.981``, or ``test loss 0.0091`` where the task measures no accuracy)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cmdare.console import console as make_console
from cmdare.train.callbacks import EvalReport, EventReport, RunInfo, RunSummary, StepReport, TrainCallback

_SHOWN = {"revocation", "notice", "worker_lost", "replacement_joined", "replacement_retried", "chief_change",
          "shard_lost", "shard_unresponsive", "shard_restored", "ps_add", "ps_remove"}

# What an event line says (``step 120: worker 1 revoked``).
_WORDS = {"revocation": "revoked", "notice": "got a preemption notice", "worker_lost": "lost",
          "replacement_joined": "joined (a replacement)",
          "shard_lost": "a parameter shard was lost",
          "ps_add": "a parameter shard added", "ps_remove": "a parameter shard removed",
          "mitigation": "bottleneck mitigation"}


def _number(value: float | None) -> str:
    """A loss as the bar shows it: ``0.008``, ``7.55e+15`` for a huge one, ``nan``, ``-`` before the first."""
    if value is None:
        return "-"
    return f"{value:.3f}" if math.isfinite(value) and abs(value) < 1e4 else f"{value:.3g}"


def _restored_words(report: EventReport) -> str:
    """Where a restore took the shards: the newest checkpoint, or the run's start when none was stored."""
    d = report.details
    if d.get("from_checkpoint", True):
        return f"shards restored from the newest checkpoint (step {d.get('checkpoint_step', '?')})"
    return f"shards restored to the start of the run (step {d.get('checkpoint_step', '?')}: nothing stored yet)"


def _event_words(report: EventReport) -> str:
    """What an event line says after ``step N:``."""
    if report.kind == "chief_change":
        return _chief_words(report)
    if report.kind == "shard_restored":
        return _restored_words(report)
    if report.kind == "shard_unresponsive":
        return (f"parameter shard {report.shard_id} did not answer within {report.details.get('timeout_s', 0):g} s "
                "(a frozen or hung process): ended, and handled as a lost shard")
    if report.kind == "replacement_retried":  # its start failed, not by its own fault: asked for again
        return f"worker {report.worker_id} (a replacement): {report.details.get('reason', 'no start')}; asked for again"
    who = f"worker {report.worker_id} " if report.worker_id is not None else ""
    return who + _WORDS.get(report.kind, report.kind.replace("_", " "))


def _chief_words(report: EventReport) -> str:
    """A chief change in words; ``worker_id`` None: the chief left and no worker was left to take over."""
    if report.worker_id is not None:
        return f"worker {report.worker_id} is the chief now"
    previous = report.details.get("from")
    was = f" (worker {previous} was)" if previous is not None else ""
    return f"no worker left to be the chief{was}; the next to join takes over"


class ProgressCallback(TrainCallback):
    """Shows a live progress bar on the console (stderr by default)."""

    def __init__(self, total_steps: int, console: Console | None = None):
        self.total = total_steps
        self.console = console or make_console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[speed]:>6.1f} steps/s"), TextColumn("train loss {task.fields[loss]}"),
            TextColumn("test {task.fields[test]}"), TimeElapsedColumn(), console=self.console, transient=False,
        )
        self.task = None

    def on_run_start(self, info: RunInfo) -> None:
        self.progress.start()
        self.task = self.progress.add_task("train", total=self.total, completed=info.resumed_from_step,
                                           speed=0.0, loss=_number(None), test="-")

    def on_step(self, report: StepReport) -> None:
        self.progress.update(self.task, completed=min(report.global_step, self.total),
                             speed=report.cluster_steps_per_s, loss=_number(report.loss))

    def on_eval(self, report: EvalReport) -> None:
        shown = f"acc {report.accuracy:.3f}" if report.accuracy is not None else f"loss {report.loss:.4g}"
        self.progress.update(self.task, test=shown)

    def on_event(self, report: EventReport) -> None:
        if report.kind == "cluster_joined":
            self.progress.console.print(f"joined the Ray cluster at {report.details['cluster']}", highlight=False,
                                        markup=False)
        elif report.kind in _SHOWN or (report.kind == "mitigation" and report.details.get("phase") != "recommendation"):
            self.progress.console.print(f"step {report.global_step}: {_event_words(report)}", highlight=False,
                                        markup=False)

    def on_run_end(self, summary: RunSummary) -> None:
        # while training the bar shows the recent speed; at the end the run's, as the summary does
        self.progress.update(self.task, completed=min(summary.global_step, self.total), speed=summary.steps_per_s)
        self.progress.stop()
