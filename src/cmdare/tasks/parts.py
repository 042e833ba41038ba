"""The parts of a task a practitioner brings: a model factory, a dataset, a loss and a metric.

Each part is given as a Python object (the API: ``TrainSpec(model=build_net, dataset=SineWaves(), loss=...)``;
Ray pickles it to the workers with the spec) or as an import path (the CLI: ``--dataset mypkg.data:make_set``;
imported on each worker, see :mod:`cmdare.workloads.import_path`). A run records each part by name:
its import path, or ``<python NAME>`` for an object no other process can import (defined in ``__main__``, or
an instance).
"""

from __future__ import annotations

from typing import Any

from cmdare.errors import UserInputError
from cmdare.workloads.import_path import call_with, is_import_path, load_factory, load_object

__all__ = ["OBJECT_PREFIX", "check_part", "loss_function", "metric_function", "part_name", "resolve_part"]

OBJECT_PREFIX = "<python "  # the recorded name of a part that only the process that made it can use


def part_name(part: Any) -> str:
    """How a run records ``part``: a string as given; an importable function or class as ``module:qualname``
    (a resumed run imports it again); anything else as ``<python NAME>``."""
    if isinstance(part, str):
        return part
    module, qualname = getattr(part, "__module__", None), getattr(part, "__qualname__", None)
    if module and qualname and module != "__main__" and "<" not in qualname:
        return f"{module}:{qualname}"
    return f"{OBJECT_PREFIX}{qualname or type(part).__name__ + ' object'}>"


def check_part(part: Any, option: str, *, callable_only: bool = True) -> None:
    """Refuse a part that is neither an import path nor (with ``callable_only``) a callable, before anything
    loads (a plain name is for the caller to check against its registry).

    Raises:
        UserInputError: a string that is not ``package.module:attribute``, or an object of the wrong kind.
    """
    if isinstance(part, str):
        if part.startswith(OBJECT_PREFIX):
            raise UserInputError(f"{option} {part}: this run was given a Python object that only its own process "
                                 "can use; resume or export it from Python, passing the same object again")
        if not is_import_path(part):
            raise UserInputError(f"{option} must be an import path such as mypkg.module:function, got {part!r}")
        return
    if callable_only and not callable(part):
        raise UserInputError(f"{option}: expected a function or an import path, got a {type(part).__name__}")


def resolve_part(part: Any, option: str) -> Any:
    """The object ``part`` names: imported for an import path, else ``part`` itself.

    Raises:
        UserInputError: the path does not import (the message names the node).
    """
    return load_object(part, option) if isinstance(part, str) else part


def _callable(part: Any, option: str) -> Any:
    fn = load_factory(part, option) if isinstance(part, str) else part
    import torch

    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):  # torch.nn:MSELoss: a loss module's class
        fn = call_with(fn, f"{option} {part_name(part)}")
    if not callable(fn):
        raise UserInputError(f"{option} {part_name(part)}: not callable")
    return fn


def loss_function(part: Any) -> Any:
    """The loss ``part`` names (None: cross-entropy): ``loss(output, target)`` -> a scalar tensor."""
    if part is None:
        import torch.nn.functional as F

        return F.cross_entropy
    return _callable(part, "--loss")


def metric_function(part: Any) -> Any:
    """The metric ``part`` names, or None: ``metric(output, target)`` -> a number or ``{name: number}``, the
    mean over the batch."""
    return None if part is None else _callable(part, "--metric")
