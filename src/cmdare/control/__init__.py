"""The control kernel: policies and membership state that neither Ray nor SimPy appears in.

The Ray trainer (:mod:`cmdare.train`) and the SimPy simulator (:mod:`cmdare.plan`) are two
executors of the same decisions: both build a :class:`MembershipKernel` from the same registries,
tell it what happened and act on what it returns.

Registries (one vocabulary for ``cmdare train`` and ``cmdare plan``): :data:`REPLACEMENT_POLICIES`
(``same``, ``cheapest``, ``none``), :data:`LR_POLICIES` (``unchanged``, ``linear``, ``sqrt``,
``staleness``), :data:`CHIEF_POLICIES` (``longest-serving``), :data:`REVOCATION_SOURCES`
(``lifetime``, ``periodic``, ``trace``, ``none``).
"""

from cmdare.control.chief import CHIEF_POLICIES, ChiefPolicy, LongestServing
from cmdare.control.clock import Clock, ManualClock, WallClock
from cmdare.control.kernel import (
    ChiefChange,
    Decision,
    LrChange,
    MembershipKernel,
    NoWorkersLeft,
    RequestReplacement,
)
from cmdare.control.lr import LR_POLICIES, LrPolicy
from cmdare.control.membership import Membership, MembershipEvent, PendingReplacement, WorkerInfo
from cmdare.control.ps_servers import (
    Evacuate,
    PsServerInfo,
    PsServerKernel,
    RequestPsReplacement,
    RestoreShards,
)
from cmdare.control.registry import Registry
from cmdare.control.replacement import REPLACEMENT_POLICIES, NoReplace, Offer, Replace, ReplacementPolicy
from cmdare.control.revocation import (
    REVOCATION_SOURCES,
    LifetimeRevocations,
    NoRevocations,
    PeriodicRevocations,
    RevocationPlan,
    RevocationSource,
    TraceRevocations,
    build_revocation_source,
)

__all__ = [
    "CHIEF_POLICIES",
    "LR_POLICIES",
    "REPLACEMENT_POLICIES",
    "REVOCATION_SOURCES",
    "ChiefChange",
    "ChiefPolicy",
    "Clock",
    "Decision",
    "Evacuate",
    "LifetimeRevocations",
    "LongestServing",
    "LrChange",
    "LrPolicy",
    "ManualClock",
    "Membership",
    "MembershipEvent",
    "MembershipKernel",
    "NoReplace",
    "NoRevocations",
    "NoWorkersLeft",
    "Offer",
    "PendingReplacement",
    "PeriodicRevocations",
    "PsServerInfo",
    "PsServerKernel",
    "Registry",
    "Replace",
    "ReplacementPolicy",
    "RequestPsReplacement",
    "RequestReplacement",
    "RestoreShards",
    "RevocationPlan",
    "RevocationSource",
    "TraceRevocations",
    "WallClock",
    "WorkerInfo",
    "build_revocation_source",
]
