"""Placement: which shard holds which parameter block.

A :class:`Placement` is a value (blocks plus the shard of each); strategies compute one and are
registered by name. Round-robin over whole tensors is TensorFlow's default and cmdare's default.
The value, the base class and the table live in :mod:`cmdare.ps.placement_base`; importing this
module registers the other strategies (:mod:`cmdare.ps.strategies`).
"""

from __future__ import annotations

import cmdare.ps.strategies  # noqa: F401 - registers greedy, mxnet, byteps, psld
from cmdare.errors import UnknownNameError
from cmdare.ps.placement_base import (
    DEFAULT_PLACEMENT,
    PLACEMENTS,
    Placement,
    PlacementStrategy,
    RoundRobin,
    register_placement,
)

__all__ = ["DEFAULT_PLACEMENT", "PLACEMENTS", "Placement", "PlacementStrategy", "RoundRobin", "get_placement",
           "register_placement"]


def get_placement(name: str) -> PlacementStrategy:
    """The strategy registered as ``name``; unknown names list the valid ones."""
    try:
        return PLACEMENTS[name]()
    except KeyError:
        raise UnknownNameError("placement", name, sorted(PLACEMENTS)) from None

