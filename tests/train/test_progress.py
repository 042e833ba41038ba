"""The progress bar and the summary agree at the end (issue 30: the bar said 0.4 steps/s, the summary 1.1), and
event lines are in words."""

from __future__ import annotations

import io

from rich.console import Console

from cmdare.events import EvalReport, EventReport, RunInfo, RunSummary, StepReport
from cmdare.train.cli.progress import ProgressCallback


def test_the_bar_ends_at_the_summarys_speed_and_events_read_as_words():
    out = io.StringIO()
    bar = ProgressCallback(100, Console(file=out, width=120, force_terminal=False))
    bar.on_run_start(RunInfo("r", {}, 0.0))
    bar.on_step(StepReport("r", 1.0, 50, 0, 5, 0.1, 0.5, 0.4))  # the recent window: 0.4 steps/s
    bar.on_event(EventReport("r", 2.0, "revocation", worker_id=1, global_step=60))
    bar.on_run_end(RunSummary("r", 3.0, "finished", 100, 90.0, 1.1, 0.9, 0.3))
    text = out.getvalue()
    assert "step 60: worker 1 revoked" in text and "progress.py" not in text
    assert text.rstrip().splitlines()[-1].count("1.1 steps/s") == 1


def _bar_text(*reports) -> str:
    out = io.StringIO()
    bar = ProgressCallback(100, Console(file=out, width=200, force_terminal=False))
    bar.on_run_start(RunInfo("r", {}, 0.0))
    for report in reports:
        {StepReport: bar.on_step, EvalReport: bar.on_eval, EventReport: bar.on_event}[type(report)](report)
    bar.on_run_end(RunSummary("r", 3.0, "finished", 100, 90.0, 1.1, 0.9, 0.3))
    return out.getvalue()


def test_the_bar_labels_the_training_loss_and_the_test_evaluation():
    """Issue 42: the bar read ``loss 0.008 acc test loss 0.009101`` for a task without accuracy."""
    step = StepReport("r", 1.0, 50, 0, 5, 0.1, 0.008, 0.4)
    text = _bar_text(step, EvalReport("r", 2.0, 50, 0, None, 0.009101))
    assert "train loss 0.008" in text and "test loss 0.009101" in text and "acc test" not in text
    text = _bar_text(step, EvalReport("r", 2.0, 50, 0, 0.981, 0.05))
    assert "train loss 0.008" in text and "test acc 0.981" in text
    huge = _bar_text(StepReport("r", 1.0, 50, 0, 5, 0.1, 7550046237097984.0, 0.4))
    assert "train loss 7.55e+15" in huge  # not 7550046237097984.000


def test_a_chief_change_names_the_new_chief_or_says_none_is_left():
    """Issue 42: ``step 206: is the chief now`` named no worker: the event of a chief who left with no worker to
    take over carries no worker id (the controller elects nobody); the line says so."""
    text = _bar_text(EventReport("r", 1.0, "chief_change", 591, worker_id=4, details={"from": 1, "to": 4}),
                     EventReport("r", 2.0, "chief_change", 206, worker_id=None, details={"from": 1, "to": None}))
    assert "step 591: worker 4 is the chief now" in text
    assert "step 206: no worker left to be the chief (worker 1 was); the next to join takes over" in text
    assert "step 206: is the chief now" not in text


def test_a_replacement_asked_for_again_says_why():
    """Issue 42 item 9: a replacement whose start failed with its node is asked for again, and says so."""
    why = "failed to start (its creation was cancelled before it ran (its node died or was drained))"
    text = _bar_text(EventReport("r", 1.0, "replacement_retried", 330, worker_id=2, details={"reason": why}))
    assert f"step 330: worker 2 (a replacement): {why}; asked for again" in text
