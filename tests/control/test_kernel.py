"""The control kernel without Ray or SimPy: chief election, replacement policies, LR policies on
membership changes, revocation sources and the registries' one vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.servers import ServerSpec
from cmdare.control import (
    CHIEF_POLICIES,
    LR_POLICIES,
    REPLACEMENT_POLICIES,
    REVOCATION_SOURCES,
    ChiefChange,
    LifetimeRevocations,
    LrChange,
    MembershipKernel,
    NoReplace,
    NoWorkersLeft,
    Offer,
    PeriodicRevocations,
    Replace,
    RequestReplacement,
    RevocationPlan,
    TraceRevocations,
    WorkerInfo,
    build_revocation_source,
)
from cmdare.errors import UnknownNameError, UserInputError

K80 = ServerSpec("K80", "gcp", "us-east1", True, 0.135)
V100 = ServerSpec("V100", "gcp", "us-east1", True, 0.74)
T4 = ServerSpec("T4", "gcp", "us-west1", True, 0.11)


def worker(wid: int, slot: int | None = None, ready_at: float = 0.0, server: ServerSpec = K80) -> WorkerInfo:
    return WorkerInfo(wid, wid if slot is None else slot, server, ready_at)


def test_chief_is_the_longest_serving_worker_not_the_lowest_slot():
    elect = CHIEF_POLICIES.create("longest-serving").elect
    assert elect([]) is None
    first_wave = [worker(2, ready_at=0.0), worker(1, ready_at=0.0), worker(3, ready_at=0.0)]
    assert elect(first_wave) == 1  # ties: the lowest worker id
    # a replacement in slot 0 (ready later) does not outrank the worker of slot 2 that served before it
    assert elect([worker(4, slot=0, ready_at=50.0), worker(2, ready_at=0.0)]) == 2


def test_replacement_policies():
    same, cheapest, none = (REPLACEMENT_POLICIES.create(n) for n in ("same", "cheapest", "none"))
    offers = [Offer(K80, 10.0), Offer(V100, 80.0), Offer(T4, 5.0)]
    assert same.decide(K80, offers) == Replace(K80)
    assert none.decide(K80, offers) == NoReplace()
    # per step: K80 0.135/10 = 0.0135, V100 0.74/80 = 0.00925, T4 0.11/5 = 0.022 -> V100, not the lowest price
    assert cheapest.decide(K80, offers) == Replace(V100)
    assert cheapest.decide(K80, [Offer(K80, 10.0), Offer(T4, 100.0)]) == Replace(T4)
    on_demand = ServerSpec("A100", "gcp", "us-east1", False, 0.01)
    assert cheapest.decide(K80, [Offer(on_demand, 1e6), Offer(K80, 1.0)]) == Replace(K80)  # transient only
    assert cheapest.decide(K80, []) == Replace(K80)  # nothing offered: the same server


def test_kernel_loss_reelects_and_requests_replacement_into_the_same_slot():
    k = MembershipKernel(3, replacement="same", lr_policy="linear")
    assert k.start([worker(i) for i in range(3)], 0.0) == [ChiefChange(None, 0)]  # full strength: LR 1
    out = k.lose(0, 5.0)
    assert out == [ChiefChange(0, 1), LrChange(1.0, 2 / 3, 2), RequestReplacement(0, K80, 0)]
    assert k.state.chief == 1 and [p.slot for p in k.state.pending] == [0]
    out = k.join(worker(3, slot=0, ready_at=12.0), 12.0)
    assert out == [LrChange(2 / 3, 1.0, 3)]  # the chief stays with worker 1
    assert k.state.pending == () and k.state.chief == 1
    kinds = [e.kind for e in k.timeline]
    assert kinds == ["join"] * 3 + ["chief_change", "loss", "chief_change", "lr_change", "replacement_requested",
                                    "join", "lr_change"]
    # one at a time, the chief is the first to join and the LR follows every join
    k = MembershipKernel(2, lr_policy="linear")
    assert k.join(worker(0), 0.0) == [ChiefChange(None, 0), LrChange(1.0, 0.5, 1)]
    assert k.join(worker(1), 0.0) == [LrChange(0.5, 1.0, 2)]


def test_kernel_no_worker_left():
    k = MembershipKernel(2, replacement="none")
    k.start([worker(0), worker(1)], 0.0)
    assert k.lose(1, 1.0) == []
    assert k.lose(0, 2.0) == [ChiefChange(0, None), NoWorkersLeft()]
    assert k.timeline[-1].kind == "no_workers_left"
    # with replacements on their way the run waits for them instead
    k = MembershipKernel(1, replacement="same")
    k.join(worker(0), 0.0)
    assert NoWorkersLeft() not in k.lose(0, 1.0)
    assert k.lose(0, 1.0) == []  # losing an unknown worker twice changes nothing


def test_lr_policies_on_membership_change():
    for name, expected in (("unchanged", 1.0), ("linear", 0.5), ("sqrt", 0.5 ** 0.5), ("staleness", 1.0)):
        k = MembershipKernel(4, lr_policy=name, replacement="none")
        k.start([worker(i) for i in range(4)], 0.0)
        k.lose(0, 1.0)
        k.lose(1, 2.0)
        assert k.state.lr_scale == pytest.approx(expected), name
    assert LR_POLICIES.canonical("constant") == "unchanged"


def test_lifetime_revocations_count_from_ready_at():
    src = LifetimeRevocations(lambda w: 3600.0, speedup=3600.0)
    assert src.deadline(worker(0, ready_at=100.0)) == 101.0
    assert src.deadline(WorkerInfo(1, 1, ServerSpec("K80", "gcp", "us-east1", False, 0.45), 0.0)) is None  # on-demand
    k = MembershipKernel(1, revocations=src)
    k.join(worker(0, ready_at=100.0), 100.0)
    assert k.due(200.0, 100.0) == []  # not trained yet: never revoked
    k.trained(0, 100.5)
    assert k.due(100.9, 100.0) == [] and k.due(101.0, 100.0) == [0]
    # from a lifetime model: seeded draws
    a = LifetimeRevocations.from_model("bathtub", np.random.default_rng(1), 3600.0).deadline(worker(0))
    b = LifetimeRevocations.from_model("bathtub", np.random.default_rng(1), 3600.0).deadline(worker(0))
    assert a == b and 0 < a <= 24.5


def test_periodic_and_trace_revocations():
    rng = np.random.default_rng(0)
    src = PeriodicRevocations(5.0, 2.0, rng)
    live = [WorkerInfo(i, i, K80, 0.0, trained_at=0.0) for i in range(3)]
    assert src.next_due(10.0) == 12.0 and src.due(11.9, 10.0, live) == []
    picked = src.due(12.0, 10.0, live)
    assert len(picked) == 1 and picked[0] in (0, 1, 2) and src.next_due(10.0) == 17.0
    trace = TraceRevocations([(6.0, 1), (3.0, 0)])
    assert trace.next_due(10.0) == 13.0
    assert trace.due(12.0, 10.0, live) == [] and trace.due(13.0, 10.0, live) == [0]
    assert trace.due(20.0, 10.0, live) == [1] and trace.next_due(10.0) is None


def test_revocation_specs_and_the_one_vocabulary():
    plan = RevocationPlan.parse("trace=3@0+6.5@1")
    assert plan.trace == ((3.0, 0), (6.5, 1)) and plan.source == "trace" and plan.enabled
    assert isinstance(build_revocation_source(plan), TraceRevocations)
    assert RevocationPlan.parse("every=2,first=1").source == "periodic"
    assert RevocationPlan.parse("lifetime=bathtub,speedup=60").speedup == 60
    assert not RevocationPlan.parse("none").enabled
    for bad in ("every", "trace=3", "every=2,trace=1@0", "speed=3", "every=-1", "trace=-1@0"):
        with pytest.raises(UserInputError, match="--revocations"):
            RevocationPlan.parse(bad)
    assert REVOCATION_SOURCES.canonical("every") == "periodic"
    assert REPLACEMENT_POLICIES.names() == ("same", "cheapest", "none")
    with pytest.raises(UnknownNameError, match="valid: same, cheapest, none"):
        REPLACEMENT_POLICIES.create("fastest")


def test_the_kernel_takes_the_drivers_time_with_each_call():
    k = MembershipKernel(2, replacement="same", lr_policy="linear", revocations=LifetimeRevocations(lambda w: 10.0))
    k.start([worker(0, ready_at=100.0), worker(1, ready_at=100.0)], 100.0)
    k.trained(0, 100.0)
    k.trained(1, 100.0)
    assert k.due(109.0, 100.0) == []
    assert k.due(110.0, 100.0) == [0, 1]
    k.mark_revoked(0)
    assert k.due(110.0, 100.0) == [1]  # revoked, loss not yet reported: not revoked twice
    k.lose(0, 110.0)
    assert [(e.kind, e.time) for e in k.timeline if e.kind in ("loss", "replacement_requested")] == [
        ("loss", 110.0), ("replacement_requested", 110.0)]


def test_a_replacement_that_never_comes_falls_back_or_gives_the_slot_up():
    offers = [Offer(K80, 10.0), Offer(V100, 80.0), Offer(T4, 5.0)]
    same, cheapest, none = (REPLACEMENT_POLICIES.create(n) for n in ("same", "cheapest", "none"))
    assert isinstance(same.fallback(K80, [K80], offers), NoReplace)
    assert isinstance(none.fallback(K80, [K80], offers), NoReplace)
    assert cheapest.fallback(K80, [V100], offers) == Replace(K80)  # V100 did not come: the next per step
    assert cheapest.fallback(K80, [V100, K80], offers) == Replace(T4)
    assert isinstance(cheapest.fallback(K80, [V100, K80, T4], offers), NoReplace)

    k = MembershipKernel(2, replacement="cheapest", offers=lambda lost: offers)
    k.start([worker(0), worker(1)], 0.0)
    assert RequestReplacement(0, V100, 0) in k.lose(0, 1.0)
    assert k.replacement_failed(0, 61.0) == [RequestReplacement(0, K80, 0)]  # V100 never came: K80 next
    assert [(p.slot, p.server) for p in k.state.pending] == [(0, K80)]
    assert k.replacement_failed(0, 121.0) == [RequestReplacement(0, T4, 0)]
    assert k.replacement_failed(0, 181.0) == []  # nothing else to try: train on with worker 1
    assert k.state.pending == () and [w.worker_id for w in k.state.workers] == [1]
    assert k.replacement_failed(0, 200.0) == []  # no pending replacement for the slot: nothing to do
    assert [e.kind for e in k.timeline].count("replacement_failed") == 3

    k = MembershipKernel(1, replacement="same")
    k.start([worker(0)], 0.0)
    k.lose(0, 1.0)
    assert k.replacement_failed(0, 100.0) == [NoWorkersLeft()]  # the last worker's replacement never came
    # a slot filled again forgets what was tried for it
    k = MembershipKernel(2, replacement="cheapest", offers=lambda lost: offers)
    k.start([worker(0), worker(1)], 0.0)
    k.lose(0, 1.0)
    k.replacement_failed(0, 2.0)
    k.join(worker(2, slot=0), 3.0)
    k.lose(2, 4.0)
    assert k.replacement_failed(0, 5.0) == [RequestReplacement(0, K80, 2)]  # V100 tried for this loss only


def test_a_start_that_failed_not_by_its_own_fault_asks_for_the_same_server_again():
    """Issue 42 item 9: the driver says a replacement's start failed with its node; the kernel asks for the same
    server for the slot again (no policy fallback: ``cheapest`` would have moved on to another type), the slot
    pending as it was, and records why."""
    offers = [Offer(V100, 10.0), Offer(K80, 1.0)]  # V100 the cheaper per step
    k = MembershipKernel(2, replacement="cheapest", offers=lambda lost: offers)
    k.start([worker(0), worker(1)], 0.0)
    assert RequestReplacement(0, V100, 0) in k.lose(0, 1.0)
    why = "its node died while it started"
    assert k.retry(0, 4.0, why) == [RequestReplacement(0, V100, 0)]
    assert [(p.slot, p.server, p.requested_at) for p in k.state.pending] == [(0, V100, 1.0)]
    retried = [e for e in k.timeline if e.kind == "replacement_retried"]
    assert [(e.worker_id, e.slot, e.details) for e in retried] == [(0, 0, {"why": why, "gpu": V100.gpu_type})]
    assert k.retry(1, 5.0) == []  # no replacement pending for that slot: nothing to ask for
