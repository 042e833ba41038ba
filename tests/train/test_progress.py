"""The progress bar and the summary agree at the end (issue 30: the bar said 0.4 steps/s, the summary 1.1), and
event lines are in words."""

from __future__ import annotations

import io

from rich.console import Console

from cmdare.events import EventReport, RunInfo, RunSummary, StepReport
from cmdare.train.progress import ProgressCallback


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
