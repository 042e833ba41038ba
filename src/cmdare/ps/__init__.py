"""cmdare.ps: the parameter server: blocks, placements, shard state and PSLD load balancing.

The placement API is re-exported here, loaded on first use (:mod:`cmdare.ps.optimizer` imports
torch); :mod:`cmdare.ps.psld` holds the load balancer.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Block": "cmdare.ps.blocks",
    "ParamInfo": "cmdare.ps.blocks",
    "split_blocks": "cmdare.ps.blocks",
    "OptimizerConfig": "cmdare.ps.optimizer",
    "Placement": "cmdare.ps.placement",
    "PlacementStrategy": "cmdare.ps.placement",
    "get_placement": "cmdare.ps.placement",
    "register_placement": "cmdare.ps.placement",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cmdare.ps' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
