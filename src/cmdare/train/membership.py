"""Membership decisions: who replaces a lost worker, and who is the chief.

Policies decide, the coordinator acts (the same policy objects can drive the simulator). A
replacement policy returns :class:`Replace` (start a server of this spec) or :class:`NoReplace`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cmdare.cloud.servers import ServerSpec
from cmdare.errors import UnknownNameError


@dataclass(frozen=True)
class Replace:
    """Start a new server of ``spec`` for the lost worker's data slot."""

    spec: ServerSpec


@dataclass(frozen=True)
class NoReplace:
    """Continue with the remaining workers."""

    reason: str = "replacement disabled"


class ReplacementPolicy(ABC):
    """Chooses what replaces a revoked or failed worker server."""

    name = ""

    @abstractmethod
    def decide(self, lost: ServerSpec) -> Replace | NoReplace:
        """The decision for a lost server of spec ``lost``."""


class ReplaceSame(ReplacementPolicy):
    """A server of the same type, region and pricing (CM-DARE's default)."""

    name = "same"

    def decide(self, lost: ServerSpec) -> Replace | NoReplace:
        return Replace(lost)


class ReplaceCheapest(ReplacementPolicy):
    """The cheapest transient worker slot of the same GPU type in the catalog (any region)."""

    name = "cheapest"

    def decide(self, lost: ServerSpec) -> Replace | NoReplace:
        from cmdare.cloud.catalog import default_catalog

        cloud = lost.cloud if lost.cloud != "local" else None
        return Replace(default_catalog().cheapest(gpu=lost.gpu_type, transient=True, cloud=cloud))


class NoReplacement(ReplacementPolicy):
    """Never replace; train on with the survivors."""

    name = "none"

    def decide(self, lost: ServerSpec) -> Replace | NoReplace:
        return NoReplace()


REPLACEMENT_POLICIES: dict[str, Callable[[], ReplacementPolicy]] = {
    p.name: p for p in (ReplaceSame, ReplaceCheapest, NoReplacement)
}


def get_replacement_policy(name: str) -> ReplacementPolicy:
    """The policy registered as ``name`` (``same``, ``cheapest``, ``none``)."""
    try:
        return REPLACEMENT_POLICIES[name]()
    except KeyError:
        raise UnknownNameError("replacement policy", name, sorted(REPLACEMENT_POLICIES)) from None


def elect_chief(live_worker_ids: Iterable[int]) -> int | None:
    """The new chief: the longest-serving live worker (lowest id), or None when none is left."""
    return min(live_worker_ids, default=None)


LR_POLICIES = ("unchanged", "linear", "sqrt", "staleness")


def lr_scale(policy: str, active_workers: int, planned_workers: int) -> float:
    """Learning-rate multiplier when ``active_workers`` of ``planned_workers`` are training.

    ``linear`` scales with the number of active workers (ICAC 2019: 92.85% vs 91.75% unchanged),
    ``sqrt`` with its square root; ``unchanged`` and ``staleness`` (damped per push on the shards
    instead) keep 1.
    """
    if policy not in LR_POLICIES:
        raise UnknownNameError("learning-rate policy", policy, LR_POLICIES)
    ratio = max(active_workers, 1) / max(planned_workers, 1)
    return {"linear": ratio, "sqrt": ratio ** 0.5}.get(policy, 1.0)
