"""The PS kernel: notices of transient parameter servers and what they decide (no Ray, no SimPy)."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.servers import ServerSpec
from cmdare.control import (
    Evacuate,
    LifetimeRevocations,
    MembershipKernel,
    PeriodicRevocations,
    PsServerKernel,
    RequestPsReplacement,
    RestoreShards,
    RevocationPlan,
    WorkerInfo,
)
from cmdare.errors import UserInputError

PS = ServerSpec(None, "gcp", "us-east1", True, 0.08, role="ps")
ON_DEMAND_PS = ServerSpec(None, "gcp", "us-east1", False, 0.21, role="ps")
K80 = ServerSpec("k80", "gcp", "us-east1", True, 0.14)


def test_notice_with_survivors_evacuates_onto_them_and_asks_for_a_replacement():
    kernel = PsServerKernel(notice_s=2.0)
    a, b = kernel.add(PS, 0.0), kernel.add(PS, 0.0)
    assert a.worker_id < 0 and b.worker_id < 0 and a.worker_id != b.worker_id
    decisions = kernel.revoke(a.worker_id, 10.0, num_shards=2)
    assert decisions == [Evacuate(a.worker_id, 12.0, "survivors"), RequestPsReplacement(a.worker_id, PS)]
    assert kernel.revoke(a.worker_id, 10.5, num_shards=2) == []  # noticed once
    assert [s.worker_id for s in kernel.candidates()] == [b.worker_id]
    assert kernel.deadline_passed(11.9) == [] and kernel.deadline_passed(12.0) == [RestoreShards(a.worker_id,
                                                                                                "deadline_passed")]
    kernel.remove(a.worker_id)
    assert kernel.deadline_passed(20.0) == []


def test_last_shard_evacuates_onto_its_replacement_even_without_replacement_policy():
    kernel = PsServerKernel(notice_s=30.0, replace=False)
    only = kernel.add(PS, 0.0)
    assert kernel.revoke(only.worker_id, 5.0, num_shards=1) == [Evacuate(only.worker_id, 35.0, "replacement"),
                                                                RequestPsReplacement(only.worker_id, PS)]
    two = PsServerKernel(notice_s=30.0, replace=False)
    x, _ = two.add(PS, 0.0), two.add(PS, 0.0)
    assert two.revoke(x.worker_id, 5.0, num_shards=2) == [Evacuate(x.worker_id, 35.0, "survivors")]


def test_without_notice_the_shard_is_restored_from_the_checkpoint():
    kernel = PsServerKernel(notice_s=0.0)
    a = kernel.add(PS, 0.0)
    assert kernel.revoke(a.worker_id, 3.0, num_shards=2) == [RestoreShards(a.worker_id, "no_notice")]


def test_lifetimes_give_each_ps_server_a_notice_lead_before_its_end():
    source = LifetimeRevocations(lambda _info: 100.0)
    kernel = PsServerKernel(source, notice_s=30.0)
    a = kernel.add(PS, 10.0)  # lives until 110: notice due from 80
    od = kernel.add(ON_DEMAND_PS, 10.0)  # on-demand: never revoked
    assert kernel.deadlines == {a.worker_id: 110.0}
    assert kernel.notices_due(79.9) == [] and kernel.notices_due(80.0) == [a.worker_id]
    assert kernel.revoke(a.worker_id, 80.0, 2)[0] == Evacuate(a.worker_id, 110.0, "survivors")
    assert kernel.notices_due(200.0) == [] and od.worker_id not in kernel.deadlines


def test_one_periodic_stream_picks_among_workers_and_ps_servers():
    kernel = MembershipKernel(2, revocations=PeriodicRevocations(1.0, None, np.random.default_rng(0)))
    kernel.start([WorkerInfo(i, i, K80, 0.0, trained_at=0.0) for i in range(2)], 0.0)
    ps = PsServerKernel(kernel.revocations, notice_s=1.0)
    servers = [ps.add(PS, 0.0) for _ in range(2)]
    picks = []
    for t in range(1, 41):
        picks += kernel.due(float(t), 0.0, others=ps.candidates())
    assert any(p < 0 for p in picks) and any(p >= 0 for p in picks)  # both kinds are hit
    assert set(ps.pick(picks)) <= {s.worker_id for s in servers}
    only_ps = MembershipKernel(2, revocations=PeriodicRevocations(1.0, None, np.random.default_rng(0)))
    only_ps.start([WorkerInfo(i, i, K80, 0.0, trained_at=0.0) for i in range(2)], 0.0)
    assert all(p < 0 for t in range(1, 11) for p in only_ps.due(float(t), 0.0, workers=False,
                                                                  others=ps.candidates()))


def test_revocation_spec_reads_notice_and_hit():
    plan = RevocationPlan.parse("every=5,notice=2")
    assert plan.notice_s == 2.0 and plan.hit == "all" and plan.hits("worker") and plan.hits("ps")
    assert RevocationPlan.parse("every=5,hit=ps").hits("worker") is False
    lifetimes = RevocationPlan.parse("lifetime=bathtub,speedup=10")
    assert lifetimes.notice_lead_s("gcp") == 3.0 and lifetimes.notice_lead_s("aws") == 12.0
    for bad in ("every=5,notice=-1", "every=5,hit=head", "every=5,notice=soon"):
        with pytest.raises(UserInputError):
            RevocationPlan.parse(bad)


def test_a_scripted_trace_aims_at_ps_servers_and_worker_targets_never_hit_them():
    from cmdare.control import TraceRevocations

    plan = RevocationPlan.parse("trace=1@ps+2@0+3@ps,notice=5")
    assert plan.trace == ((1.0, "ps"), (2.0, 0), (3.0, "ps"))
    kernel = MembershipKernel(2, revocations=TraceRevocations(plan.trace))
    kernel.start([WorkerInfo(i, i, K80, 0.0, trained_at=0.0) for i in range(2)], 0.0)
    ps = PsServerKernel(kernel.revocations, notice_s=5.0)
    oldest, _newer = ps.add(PS, 0.0), ps.add(PS, 0.5)
    assert kernel.due(1.0, 0.0, others=ps.candidates()) == [oldest.worker_id]  # the longest-serving PS server
    ps.revoke(oldest.worker_id, 1.0, num_shards=2)
    assert kernel.due(2.0, 0.0, others=ps.candidates()) == [0]
    assert kernel.due(3.0, 0.0, others=ps.candidates()) == [_newer.worker_id]
    anyone = MembershipKernel(1, revocations=TraceRevocations([(1.0, None), (2.0, "k80")]))
    anyone.start([WorkerInfo(0, 0, K80, 0.0, trained_at=0.0)], 0.0)
    assert anyone.due(2.0, 0.0, others=ps.candidates()) == [0]  # '*' and a GPU type name workers only
    with pytest.raises(UserInputError):
        RevocationPlan.parse("trace=-1@ps")
