"""Learning-rate policies applied when the number of active workers changes."""

from __future__ import annotations

from typing import Protocol

from cmdare.control.registry import Registry

__all__ = ["LR_POLICIES", "LrPolicy"]


class LrPolicy(Protocol):
    """The learning-rate multiplier for ``active`` of ``planned`` workers."""

    name: str

    def scale(self, active: int, planned: int) -> float:
        """The multiplier (1.0: the configured learning rate)."""
        ...


LR_POLICIES: Registry[LrPolicy] = Registry("learning-rate policy")


def _ratio(active: int, planned: int) -> float:
    return max(active, 1) / max(planned, 1)


@LR_POLICIES.register("unchanged", "constant")
class Unchanged:
    """Keep the configured learning rate."""

    name = "unchanged"

    def scale(self, active: int, planned: int) -> float:
        return 1.0


@LR_POLICIES.register("linear")
class Linear:
    """Scale with the number of active workers (ICAC 2019: 92.85% vs 91.75% unchanged)."""

    name = "linear"

    def scale(self, active: int, planned: int) -> float:
        return _ratio(active, planned)


@LR_POLICIES.register("sqrt")
class Sqrt:
    """Scale with the square root of the active fraction."""

    name = "sqrt"

    def scale(self, active: int, planned: int) -> float:
        return _ratio(active, planned) ** 0.5


@LR_POLICIES.register("staleness")
class Staleness:
    """Keep 1.0 here: the shards damp each push by its staleness instead."""

    name = "staleness"

    def scale(self, active: int, planned: int) -> float:
        return 1.0
