"""Replacement policies: what replaces a lost worker server.

A policy returns :class:`Replace` (start a server of this spec) or :class:`NoReplace`. When a requested
server does not come (no node arrives within the run's time limit), :meth:`ReplacementPolicy.fallback`
chooses again, knowing which specs were tried: ``cheapest`` falls back to the next offering, ``same``
gives up (the run trains on with the survivors). Prices and
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

    def fallback(self, lost: ServerSpec, tried: Sequence[ServerSpec],
                 offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        """The decision when the servers in ``tried`` were requested for ``lost``'s slot and none came."""
        ...


REPLACEMENT_POLICIES: Registry[ReplacementPolicy] = Registry("replacement policy")


@REPLACEMENT_POLICIES.register("same")
class ReplaceSame:
    """A server of the same type, region and pricing (CM-DARE's default)."""

    name = "same"

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        return Replace(lost)

    def fallback(self, lost: ServerSpec, tried: Sequence[ServerSpec],
                 offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        return NoReplace(f"no {lost.gpu_type or 'CPU'} server came in time")


@REPLACEMENT_POLICIES.register("cheapest", "cost-efficient")
class ReplaceCheapest:
    """The transient offering with the lowest price per step (ties: lower price, then GPU name and
    region); the same server as the lost one when no offering is given."""

    name = "cheapest"

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        best = _cheapest([o for o in offers if o.spec.transient and o.steps_per_s > 0])
        return Replace(best.spec if best is not None else lost)

    def fallback(self, lost: ServerSpec, tried: Sequence[ServerSpec],
                 offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        """The cheapest transient offering of a GPU type not tried yet (a type whose node did not come is
        not asked for again in another region)."""
        failed = {s.gpu_type for s in tried}
        best = _cheapest([o for o in offers if o.spec.transient and o.steps_per_s > 0
                          and o.spec.gpu_type not in failed])
        if best is None:
            return NoReplace(f"no server of another type to fall back to (tried {', '.join(sorted(map(str, failed)))})")
        return Replace(best.spec)


def _cheapest(offers: Sequence[Offer]) -> Offer | None:
    """Lowest price per step (ties: lower price, then GPU name and region)."""
    return min(offers, key=lambda o: (o.usd_per_step, o.spec.price_per_hour_usd, o.spec.gpu_type or "",
                                      o.spec.region), default=None)


@REPLACEMENT_POLICIES.register("none", "no")
class NoReplacement:
    """Never replace; train on with the survivors."""

    name = "none"

    def decide(self, lost: ServerSpec, offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        return NoReplace()

    def fallback(self, lost: ServerSpec, tried: Sequence[ServerSpec],
                 offers: Sequence[Offer] = ()) -> Replace | NoReplace:
        return NoReplace()
