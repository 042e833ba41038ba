"""A practitioner's own model named by import path: ``mypkg.models:build_net``.

The factory is imported where it is used (the driver to check and profile it; each worker to build it), so
nothing needs registering on every node. It is called with ``num_classes`` and ``in_channels`` when its
signature takes them (or ``**kwargs``), else with no argument, and must return a ``torch.nn.Module``. Every
failure is one line naming the path and the node.
"""

from __future__ import annotations

import importlib
import inspect
import re
import socket
from collections.abc import Callable
from typing import Any

from cmdare.errors import UserInputError

__all__ = ["build_from_path", "is_import_path", "load_factory"]

_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def is_import_path(name: str) -> bool:
    """Whether ``name`` looks like ``package.module:attribute`` (a zoo name never has a colon)."""
    return isinstance(name, str) and bool(_PATH.match(name))


def _where() -> str:
    return f"on node {socket.gethostname()}"


def load_factory(path: str) -> Callable[..., Any]:
    """Import the callable at ``path``.

    Raises:
        UserInputError: the module does not import, has no such attribute, or it is not callable.
    """
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure of user code is the user's to see, in one line
        raise UserInputError(f"--model {path}: cannot import {module_name} {_where()} "
                             f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserInputError(f"--model {path}: {module_name} has no {attr} {_where()}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserInputError(f"--model {path}: {attr} is not callable")
    return obj


def build_from_path(path: str, num_classes: int, in_channels: int) -> Any:
    """The module the factory at ``path`` builds (passed ``num_classes``/``in_channels`` where it takes them)."""
    import torch

    factory = load_factory(path)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in (("num_classes", num_classes), ("in_channels", in_channels))
              if takes_all or k in params}
    try:
        model = factory(**kwargs)
    except Exception as err:  # noqa: BLE001 - the user's factory failed: say so in one line
        raise UserInputError(f"--model {path}: the factory raised {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''} {_where()}") from None
    if not isinstance(model, torch.nn.Module):
        raise UserInputError(f"--model {path}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model
