"""The control kernel: a run's decisions, with neither Ray nor SimPy (nor a clock) in them.

:class:`RunController` is a training run's whole decision logic: typed events in
(:mod:`cmdare.control.run_events`), typed commands out (:mod:`cmdare.control.run_commands`). The Ray
trainer (:mod:`cmdare.train`) and the SimPy simulator (:mod:`cmdare.plan`) are two drivers of the same
controller class, which builds on the policy kernels here: :class:`MembershipKernel` (chief election,
learning rate, replacements) and :class:`PsServerKernel` (parameter servers on transient servers).
In local emulation cloud time advances with training (:class:`EmulatedClock`). The controller is the fleet; how
its members train together is a :class:`Topology` it consults (:class:`PsTopology`: a parameter server).

Registries (one vocabulary for ``cmdare train`` and ``cmdare plan``): :data:`REPLACEMENT_POLICIES`
(``same``, ``cheapest``, ``none``), :data:`LR_POLICIES` (``unchanged``, ``linear``, ``sqrt``,
``staleness``), :data:`CHIEF_POLICIES` (``longest-serving``), :data:`REVOCATION_SOURCES`
(``lifetime``, ``periodic``, ``trace``, ``none``).
"""

from cmdare.control.allreduce_topology import AllReduceTopology
from cmdare.control.chief import CHIEF_POLICIES, ChiefPolicy, LongestServing
from cmdare.control.controller import RunController
from cmdare.control.duties import DutySchedule
from cmdare.control.emulated_clock import EmulatedClock
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
from cmdare.control.ps_topology import PsTopology
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
from cmdare.control.run_config import RunConfig
from cmdare.control.run_state import RunState
from cmdare.control.topology import Quiesce, Topology

__all__ = [
    "CHIEF_POLICIES",
    "LR_POLICIES",
    "REPLACEMENT_POLICIES",
    "REVOCATION_SOURCES",
    "AllReduceTopology",
    "ChiefChange",
    "ChiefPolicy",
    "Decision",
    "DutySchedule",
    "EmulatedClock",
    "Evacuate",
    "LifetimeRevocations",
    "LongestServing",
    "LrChange",
    "LrPolicy",
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
    "PsTopology",
    "Quiesce",
    "Registry",
    "Replace",
    "ReplacementPolicy",
    "RequestPsReplacement",
    "RequestReplacement",
    "RestoreShards",
    "RevocationPlan",
    "RevocationSource",
    "RunConfig",
    "RunController",
    "RunState",
    "Topology",
    "TraceRevocations",
    "WorkerInfo",
    "build_revocation_source",
]
