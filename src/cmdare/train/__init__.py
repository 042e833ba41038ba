"""Training on Ray: the spec, the coordinator, workers, checkpoints and measurement hooks.

Python API::

    from cmdare.train import TrainSpec, train
    summary = train(TrainSpec(model="resnet15", dataset="digits", workers=2, ps=1, steps=500))

Names are imported lazily, so ``import cmdare.train.callbacks`` does not pull in torch or Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "OptimizerConfig": "cmdare.ps.optimizer",
    "TrainCallback": "cmdare.train.callbacks",
    "TrainSpec": "cmdare.train.spec",
    "Trainer": "cmdare.train.trainer",
    "train": "cmdare.train.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cmdare.train' has no attribute {name!r}")
