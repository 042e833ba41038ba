"""cmdare.measure: the measurement store, importers, characterization reports and lifetime models.

Public API (imported lazily, so ``import cmdare.measure`` stays cheap)::

    open_store(url=None) -> Store                  # cmdare.measure.store
    StoreRecorder(store_or_url=None, batch_size=200)  # cmdare.measure.recorder (a TrainCallback)
    TensorBoardCallback(logdir)                    # cmdare.measure.tensorboard
    load_lifetime_model(spec) -> LifetimeModel     # cmdare.measure.lifetime_models
    build_report(name, store, run_id=None) -> Report  # cmdare.measure.reports
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Store": "cmdare.measure.store",
    "open_store": "cmdare.measure.store",
    "StoreRecorder": "cmdare.measure.recorder",
    "TensorBoardCallback": "cmdare.measure.tensorboard",
    "LIFETIME_MODELS": "cmdare.measure.lifetime_models",
    "LifetimeModel": "cmdare.measure.lifetime_models",
    "load_lifetime_model": "cmdare.measure.lifetime_models",
    "REPORTS": "cmdare.measure.reports",
    "build_report": "cmdare.measure.reports",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cmdare.measure' has no attribute {name!r}")
