"""The optimizer a run trains with by name: ``sgd``, ``adamw``, or any ``torch.optim`` class by import path (an
all-reduce member runs it on its model; a parameter shard on its blocks, :mod:`cmdare.ps.shard_optimizer`)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from cmdare.errors import UserInputError
from cmdare.workloads.import_path import is_import_path, load_object

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import torch

    from cmdare.ps.optimizer_config import OptimizerConfig

__all__ = ["OPTIMIZERS", "build_optimizer", "optimizer_factory"]

OPTIMIZERS = ("sgd", "adamw")  # or a torch.optim.Optimizer subclass by import path (module:Class)


def build_optimizer(name: str, params: Iterable[torch.Tensor], config: OptimizerConfig) -> torch.optim.Optimizer:
    """``name``'s optimizer over ``params`` with ``config``'s hyper-parameters (SGD: lr, momentum, weight decay,
    Nesterov; AdamW and a class by import path: lr, and weight decay where the class takes it).

    Raises:
        UserInputError: an unknown name, an import path that is no ``torch.optim.Optimizer``, or a class that
            refuses those hyper-parameters.
    """
    return optimizer_factory(name, config)(params)


def optimizer_factory(name: str, config: OptimizerConfig) -> Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]:
    """:func:`build_optimizer` with the class and the hyper-parameters it takes resolved once (a shard builds its
    optimizer on every push).

    Raises:
        UserInputError: as :func:`build_optimizer` (a class that refuses the hyper-parameters: when called).
    """
    import torch

    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                                              weight_decay=config.weight_decay, nesterov=config.nesterov)
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    if not is_import_path(name):
        raise UserInputError(f"--optimizer {name}: not one of {', '.join(OPTIMIZERS)} nor an import path "
                             "(module:Class of a torch.optim.Optimizer)")
    cls: Any = load_object(name, "--optimizer")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise UserInputError(f"--optimizer {name} is {cls!r}, not a torch.optim.Optimizer class")
    given = {"lr": config.lr, "weight_decay": config.weight_decay}
    takes = inspect.signature(cls).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in takes.values()):
        given = {k: v for k, v in given.items() if k in takes}  # e.g. LBFGS has no weight decay

    def build(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        try:
            return cls(params, **given)
        except (TypeError, ValueError) as err:
            raise UserInputError(f"--optimizer {name} cannot be built with {given} ({type(err).__name__}: {err})") \
                from None

    return build
