"""The model registry: names to builders, with one clear error for an unknown name.

A builder is any callable ``builder(num_classes, in_channels) -> torch.nn.Module``. The built-in families
register the first time the registry is consulted (importing them imports torch), so
``build_model("resnet32")`` always works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.workloads.specs import MODELS, Builder, ModelSpec, add_model

if TYPE_CHECKING:
    import torch

__all__ = [
    "check_model_name",
    "Builder",
    "ModelSpec",
    "build_model",
    "describe_model",
    "list_models",
    "model_names",
    "register_model",
    "unregister_model",
]

_builtins_loaded = False


def _ensure_builtins() -> None:
    """Register the built-in zoo on first use (it imports torch, so not at package import)."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        from cmdare.workloads.zoo import register_builtin_models

        register_builtin_models()


def register_model(name: str, builder: Builder, description: str = "", *, replace: bool = False) -> ModelSpec:
    """Register ``builder`` under ``name``.

    Args:
        name: registry key, e.g. ``"resnet32"``.
        builder: ``builder(num_classes, in_channels) -> torch.nn.Module``.
        description: one line shown by ``cmdare workloads``.
        replace: allow overwriting an existing name (otherwise a duplicate raises).

    Returns:
        The stored :class:`ModelSpec`.

    Raises:
        UserInputError: ``name`` is empty or already registered and ``replace`` is false.
    """
    if not name or not isinstance(name, str):
        raise UserInputError(f"model name must be a non-empty string, got {name!r}")
    _ensure_builtins()
    if name in MODELS and not replace:
        raise UserInputError(f"model {name!r} is already registered")
    return add_model(name, builder, description)


def unregister_model(name: str) -> None:
    """Remove a registered model (for plug-ins and tests).

    Raises:
        UnknownNameError: ``name`` is not registered.
    """
    _spec(name)
    del MODELS[name]


def list_models() -> list[str]:
    """Names of all registered models, in registration order (families grouped)."""
    _ensure_builtins()
    return list(MODELS)


def check_model_name(name: str) -> None:
    """Refuse a name that is neither built in nor registered, without importing torch (a command checks its
    input before it loads anything).

    Raises:
        UnknownNameError: unknown model name.
    """
    from cmdare.workloads.families import builtin_model_names
    from cmdare.workloads.import_path import is_import_path

    if is_import_path(name):
        return  # imported where it is used (a worker's node may have it when this one does not)
    builtin = builtin_model_names()
    if name not in builtin and name not in MODELS:
        raise UnknownNameError("model", str(name), [*builtin, *(n for n in MODELS if n not in builtin)])


def _spec(name: str) -> ModelSpec:
    _ensure_builtins()
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise UnknownNameError("model", str(name), list(MODELS)) from None


def describe_model(name: str) -> str:
    """The one-line description of a registered model.

    Raises:
        UnknownNameError: ``name`` is not registered.
    """
    from cmdare.workloads.families import builtin_model_names, describe_builtin
    from cmdare.workloads.import_path import is_import_path

    if is_import_path(name):
        return f"your model, built by {name}"
    if name in builtin_model_names() and (name not in MODELS or MODELS[name].builtin):
        return describe_builtin(name)  # without loading the zoo (torch)
    return _spec(name).description


def model_names() -> list[str]:
    """:func:`list_models` without loading the zoo (torch): the built-in names, then any registered here."""
    from cmdare.workloads.families import builtin_model_names

    builtin = builtin_model_names()
    return [*builtin, *(n for n in MODELS if n not in builtin)]


def build_model(name: str, num_classes: int = 10, in_channels: int = 3) -> torch.nn.Module:
    """Build a fresh, randomly initialised model by name (uses torch's global RNG).

    Args:
        name: a name from :func:`list_models`, or the import path of the user's factory
            (``mypkg.models:build_net``, see :mod:`cmdare.workloads.import_path`).
        num_classes: size of the classifier output.
        in_channels: channels of the input images (1 for digits, 3 for CIFAR).

    Returns:
        A ``torch.nn.Module`` in training mode, on the CPU. It accepts any input of spatial size >= 8
        (global average pooling before the classifier).

    Raises:
        UnknownNameError: ``name`` is not registered (the message lists the valid names).
        UserInputError: ``num_classes`` or ``in_channels`` is not a positive integer.
    """
    from cmdare.workloads.import_path import build_from_path, is_import_path

    for label, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserInputError(f"{label} must be a positive integer, got {value!r}")
    if is_import_path(name):
        return build_from_path(name, num_classes, in_channels)
    return _spec(name).builder(num_classes, in_channels)
