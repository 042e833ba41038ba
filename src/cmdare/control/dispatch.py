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


def _owners(owner: object) -> tuple[object, ...]:
    return owner if isinstance(owner, tuple) else (owner,)


def _handler(owners: tuple[object, ...], name: str) -> Callable[[Any], Any] | None:
    for owner in owners:
        found = getattr(owner, name, None)
        if callable(found):
            return found
    return None


def missing_handlers(owner: type | object | tuple[type | object, ...], prefix: str, base: type) -> list[str]:
    """The names of the handlers ``owner`` lacks for the kinds of ``base`` (``prefix`` + kind name); ``owner``
    may be a tuple of owners, of which the first that has a handler takes the kind."""
    owners = _owners(owner)
    return [prefix + k.__name__ for k in kinds(base) if _handler(owners, prefix + k.__name__) is None]


def handler_table(owner: object | tuple[object, ...], prefix: str, base: type) -> dict[type, Callable[[Any], Any]]:
    """Kind -> bound handler of ``owner`` (or of the first of a tuple of owners that has one) for every kind of
    ``base``.

    Raises:
        TypeError: no owner has a handler (named) for a kind.
    """
    owners = _owners(owner)
    missing = missing_handlers(owners, prefix, base)
    if missing:
        names = " and ".join(type(o).__name__ for o in owners)
        raise TypeError(f"{names} handle{'s' if len(owners) == 1 else ''} no {', '.join(missing)}: every kind of "
                        f"{base.__name__} needs its handler")
    return {k: _handler(owners, prefix + k.__name__) for k in kinds(base)}  # type: ignore[misc]
