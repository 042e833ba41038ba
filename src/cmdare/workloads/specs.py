"""The table of registered models, shared by the registry and the built-in zoo.

:mod:`cmdare.workloads.registry` (the checked, public API) and :mod:`cmdare.workloads.zoo` (the
built-in families) both write here, so the zoo does not import the registry that loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Builder = Callable[[int, int], "torch.nn.Module"]

__all__ = ["MODELS", "Builder", "ModelSpec", "add_model"]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: its name, how to build it and a one-line description."""

    name: str
    builder: Builder
    description: str = ""
    builtin: bool = False  # one of the zoo's own (its profile may be cached)


MODELS: dict[str, ModelSpec] = {}  # name -> spec, in registration order


def add_model(name: str, builder: Builder, description: str = "", builtin: bool = False) -> ModelSpec:
    """Store ``builder`` under ``name`` (replacing any entry); no checks, see ``register_model``."""
    spec = ModelSpec(name, builder, description, builtin)
    MODELS[name] = spec
    return spec
