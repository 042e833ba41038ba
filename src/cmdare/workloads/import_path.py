"""A practitioner's own code named by import path: ``mypkg.models:build_net``.

The object is imported where it is used (the driver to check and profile it; each worker to build it), so
nothing needs registering on every node. A model factory is called with ``num_classes`` and ``in_channels``
when its signature takes them (or ``**kwargs``), else with no argument, and must return a ``torch.nn.Module``.
The same paths name a dataset, a loss or a metric (:mod:`cmdare.tasks`). Every failure is one line naming the
option, the path and the node.
"""

from __future__ import annotations

import importlib
import inspect
import re
import socket
from collections.abc import Callable
from typing import Any

from cmdare.errors import UserInputError
from cmdare.workloads.user_code import UserCodeTimeoutError, describe, run_bounded

__all__ = ["build_from_path", "call_with", "is_import_path", "load_factory", "load_object", "where"]

_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def is_import_path(name: str) -> bool:
    """Whether ``name`` looks like ``package.module:attribute`` (a zoo name never has a colon)."""
    return isinstance(name, str) and bool(_PATH.match(name))


def where() -> str:
    """``on node HOST``: where an import or a call of the user's code failed."""
    return f"on node {socket.gethostname()}"


def load_object(path: str, option: str = "--model") -> Any:
    """Import the object at ``path`` (``option`` names it in errors).

    Raises:
        UserInputError: the module does not import or has no such attribute.
    """
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure of user code (sys.exit too), in one line
        raise UserInputError(f"{option} {path}: cannot import {module_name} {where()} ({describe(err)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserInputError(f"{option} {path}: {module_name} has no {attr} {where()}")
        obj = getattr(obj, part)
    return obj


def load_factory(path: str, option: str = "--model") -> Callable[..., Any]:
    """Import the callable at ``path``.

    Raises:
        UserInputError: the module does not import, has no such attribute, or it is not callable.
    """
    obj = load_object(path, option)
    if not callable(obj):
        raise UserInputError(f"{option} {path}: {path.partition(':')[2]} is not callable")
    return obj


def call_with(factory: Callable[..., Any], label: str, **available: Any) -> Any:
    """``factory(**kwargs)`` with those of ``available`` its signature takes (all of them for ``**kwargs``);
    ``label`` (``--model mypkg.models:build``) names it when it fails. It runs bounded in time
    (:func:`~cmdare.workloads.user_code.run_bounded`).

    Raises:
        UserInputError: the factory raised, called ``sys.exit``, raised ``KeyboardInterrupt`` or did not return
            in time (one line: what happened, and the node).
    """
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in available.items() if takes_all or k in params}
    try:
        return run_bounded(lambda: factory(**kwargs), f"{label}: the factory {where()}")
    except UserCodeTimeoutError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as err:  # noqa: BLE001 - raised in the helper thread: the
        how = "called" if isinstance(err, SystemExit) else "raised"  # factory's own, never a Ctrl-C
        raise UserInputError(f"{label}: the factory {how} {describe(err)} {where()}") from None


def build_from_path(path: str, num_classes: int, in_channels: int) -> Any:
    """The module the factory at ``path`` builds (passed ``num_classes``/``in_channels`` where it takes them)."""
    import torch

    model = call_with(load_factory(path), f"--model {path}", num_classes=num_classes, in_channels=in_channels)
    if not isinstance(model, torch.nn.Module):
        raise UserInputError(f"--model {path}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model
