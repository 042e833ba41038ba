"""Ctrl-C and SIGTERM as a notice: the first asks the run to stop at the next step boundary and store that step; the
second exits at once.

A run used to end on Ctrl-C with exit status 130 and no word, losing every step since its last checkpoint (131
steps in one case). While :class:`StopSignals` is active (the main thread of :meth:`Trainer.run
<cmdare.train.trainer.Trainer.run>`), the first SIGINT or SIGTERM calls ``on_stop`` (the run stores the checkpoint
of the step it stops at, prints its id, that step and the resume command, and exits 130) and says so on stderr;
a second raises ``KeyboardInterrupt`` (the run ends at once, without waiting for checkpoint uploads); a third is
the system's default. Outside the main thread (a run started from a thread of the caller's) nothing is installed.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["StopSignals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context manager: SIGINT and SIGTERM handled as described above while it is active."""

    def __init__(self, on_stop: Callable[[str], None], run_id: str):
        self.on_stop, self.run_id = on_stop, run_id
        self.previous: dict[int, Any] = {}
        self.received = 0

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        if self.received == 1:
            print(f"{name}: run {self.run_id} stops at the next step and stores it (again to stop at once, without "
                  "storing it)", file=sys.stderr, flush=True)
            self.on_stop(f"interrupted ({name})")
            return
        for sig in _SIGNALS:  # a third is the system's own
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        raise KeyboardInterrupt
