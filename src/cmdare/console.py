"""The Rich consoles cmdare prints with, built in one place so that none cuts a table when piped.

Rich sizes a console that is not a terminal (output piped into ``less``, ``grep`` or a file) at 80 columns and
squeezes a wider table into them, cutting its cells (``confi…``, ``accur…``). :func:`console` gives such a
console no width limit instead: every table keeps its natural width and every line stays whole. On a
terminal, and wherever ``COLUMNS`` is set, the width is Rich's as before.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

__all__ = ["UNLIMITED_WIDTH", "console"]

#: The width of a console that is not a terminal: wider than any line cmdare prints, so nothing wraps or is cut.
UNLIMITED_WIDTH = 100_000


def console(stderr: bool = False, **options: Any) -> Console:
    """A Rich console on stdout (``stderr``: on stderr); ``options`` go to :class:`rich.console.Console`.

    Not a terminal and no ``width`` given (as an option or by ``COLUMNS``): no width limit.
    """
    out = Console(stderr=stderr, **options)
    if options.get("width") is None and not out.is_terminal and not os.environ.get("COLUMNS", "").strip():
        out.width = UNLIMITED_WIDTH
    return out
