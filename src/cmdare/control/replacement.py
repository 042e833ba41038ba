"""Replacement policies: what replaces a lost worker server.

A policy returns :class:`Replace` (start a server of this spec) or :class:`NoReplace`. Prices and
speeds are passed in as :class:`Offer` values, so ``cheapest`` means one thing in the Ray trainer
and in the simulator: the offering with the lowest price per training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cmdare.cloud.servers import ServerSpec
from cmdare.control.registry import Registry

__all__ = ["NoReplace", "Offer", "REPLACEMENT_POLICIES", "Replace", "ReplacementPolicy"]


@dataclass(frozen=True)
class Replace:
    """Start a new server of ``spec`` for the lost worker's data slot."""

    spec: ServerSpec


@dataclass(frozen=True)
class NoReplace:
    """Continue with the remaining workers."""

    reason: str = "replacement disabled"


@dataclass(frozen=True)
class Offer:
    """A server that could replace the lost one, with the worker speed it would train at."""

    spec: ServerSpec
    steps_per_s: float

    @property
    def usd_per_step(self) -> float:
        """Price per training step (infinite for a server that cannot train)."""
        if self.steps_per_s <= 0:
            return float("inf")
        return self.spec.price_per_hour_usd / 3600.0 / self.steps_per_s


class ReplacementPolicy(Protocol):
    """Chooses what replaces a revoked or failed worker server."""

    name: str

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        """The decision for a lost server of spec ``lost``, given the offerings the driver can start."""
        ...


REPLACEMENT_POLICIES: Registry[ReplacementPolicy] = Registry("replacement policy")


@REPLACEMENT_POLICIES.register("same")
class ReplaceSame:
    """A server of the same type, region and pricing (CM-DARE's default)."""

    name = "same"

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        return Replace(lost)


@REPLACEMENT_POLICIES.register("cheapest", "cost-efficient")
class ReplaceCheapest:
    """The transient offering with the lowest price per step (ties: lower price, then GPU name and
    region); the same server as the lost one when no offering is given."""

    name = "cheapest"

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        usable = [o for o in offers if o.spec.transient and o.steps_per_s > 0]
        if not usable:
            return Replace(lost)
        best = min(usable, key=lambda o: (o.usd_per_step, o.spec.price_per_hour_usd, o.spec.gpu_type or "",
                                          o.spec.region))
        return Replace(best.spec)


@REPLACEMENT_POLICIES.register("none", "no")
class NoReplacement:
    """Never replace; train on with the survivors."""

    name = "none"

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        return NoReplace()
