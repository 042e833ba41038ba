"""One registry per kind of policy: names (with old spellings as aliases) -> factories.

Both command lines (``cmdare train`` and ``cmdare plan``) and both drivers (the Ray trainer and the
SimPy simulator) look policies up here, so a name means one thing everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from cmdare.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named factories of one kind (``kind`` names it in errors, e.g. ``"replacement policy"``)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *aliases: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register a factory (a class or function) under ``name`` and its aliases."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            self._factories[name] = factory
            for alias in aliases:
                self._aliases[alias] = name
            return factory

        return add

    def names(self) -> tuple[str, ...]:
        """The canonical names, in registration order (aliases not included)."""
        return tuple(self._factories)

    def canonical(self, name: str) -> str:
        """The canonical name of ``name`` or of its alias.

        Raises:
            UnknownNameError: not registered.
        """
        key = str(name).strip().lower()
        key = self._aliases.get(key, key)
        if key not in self._factories:
            raise UnknownNameError(self.kind, name, self.names())
        return key

    def create(self, name: str, *args: object, **kwargs: object) -> T:
        """A new policy ``name`` built with the factory's arguments."""
        return self._factories[self.canonical(name)](*args, **kwargs)

    def __contains__(self, name: object) -> bool:
        key = str(name).strip().lower()
        return self._aliases.get(key, key) in self._factories
