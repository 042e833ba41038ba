"""Dispatch by type, checked complete: the controller takes every kind of event, and a driver carries out every
kind of command, or it fails when it is built (and a test says which handler is missing), never in the middle of a
run when a new kind first comes.

A handler is a method named by the kind: ``_on_ChunkDone`` for the event :class:`~cmdare.control.run_events.ChunkDone`,
``_do_StartWorker`` for the command :class:`~cmdare.control.run_commands.StartWorker`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["handler_table", "kinds", "missing_handlers"]


def kinds(base: type) -> tuple[type, ...]:
    """Every subclass of ``base``, however deep, in definition order."""
    out: list[type] = []
    for sub in base.__subclasses__():
        out += [sub, *kinds(sub)]
    return tuple(dict.fromkeys(out))


def missing_handlers(owner: type | object, prefix: str, base: type) -> list[str]:
    """The names of the handlers ``owner`` lacks for the kinds of ``base`` (``prefix`` + kind name)."""
    return [prefix + k.__name__ for k in kinds(base) if not callable(getattr(owner, prefix + k.__name__, None))]


def handler_table(owner: object, prefix: str, base: type) -> dict[type, Callable[[Any], Any]]:
    """Kind -> bound handler of ``owner`` for every kind of ``base``.

    Raises:
        TypeError: ``owner`` lacks a handler (named) for a kind.
    """
    missing = missing_handlers(owner, prefix, base)
    if missing:
        raise TypeError(f"{type(owner).__name__} handles no {', '.join(missing)}: every kind of {base.__name__} "
                        "needs its handler")
    return {k: getattr(owner, prefix + k.__name__) for k in kinds(base)}
