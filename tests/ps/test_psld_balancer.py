"""The PSLD balancer's policy: intervals, gating, straggler moves, elastic decisions."""

from __future__ import annotations

import pytest

from cmdare.errors import UserInputError
from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import Placement, get_placement
from cmdare.ps.psld import AddShard, Move, NoChange, PsldBalancer, RemoveShard, ShardLoad, ShardState


def _placement(num_shards: int = 3, num_blocks: int = 30) -> Placement:
    params = param_infos([(f"p{i}", (1000,)) for i in range(num_blocks)])  # 4000 bytes each
    return get_placement("round-robin").place(params, num_shards)


def _loads(pl: Placement, per_byte: list[float], *, busy_fraction: float = 0.5, steps: int = 10):
    held = pl.shard_bytes()
    times = [10 * per_byte[s] * held[s] for s in range(pl.num_shards)]
    window = max(times) / busy_fraction
    return [ShardLoad(s, window, steps, steps * held[s], steps * held[s], times[s], 0.5 * times[s], 0.0)
            for s in range(pl.num_shards)]


def _feed(bal: PsldBalancer, per_byte: list[float], step: int, **kw) -> None:
    bal.observe(_loads(bal.placement, per_byte, **kw), step)


def test_constructor_validates() -> None:
    pl = _placement(3)
    with pytest.raises(UserInputError):
        PsldBalancer(2, pl)
    with pytest.raises(UserInputError):
        PsldBalancer(3, pl, max_moves=0)
    with pytest.raises(UserInputError):
        PsldBalancer(3, pl, min_shards=4, max_shards=2)


def test_straggler_gets_at_most_k_moves_per_decision_then_waits() -> None:
    bal = PsldBalancer(3, _placement(), max_moves=3, interval_steps=20)
    slow = [1e-9, 1e-9, 3e-9]
    assert bal.decide(0) == [NoChange("waiting for a measurement window under the current placement")]
    _feed(bal, slow, 10)
    first = bal.decide(10)
    assert 1 <= len(first) <= 3 and all(isinstance(d, Move) and d.src == 2 for d in first)
    assert [d.state for d in bal.diagnose()][2] == ShardState.SLOW_AND_HEAVY
    new = bal.apply(first)
    assert new is bal.placement and new.version == 1 and bal.moves_made == len(first)
    assert isinstance(bal.decide(20)[0], NoChange)  # within the interval
    assert "waiting" in bal.decide(30)[0].reason  # no window measured under the new placement yet
    with pytest.raises(ValueError):
        bal.apply(first)  # stale: those blocks have moved already


def test_balancer_converges_and_then_stops_moving() -> None:
    bal = PsldBalancer(3, _placement(num_blocks=60), max_moves=4, interval_steps=10)
    slow = [1e-9, 1e-9, 3e-9]
    quiet_since = None
    for step in range(10, 1000, 10):
        _feed(bal, slow, step)
        decisions = bal.decide(step)
        if isinstance(decisions[0], NoChange):
            quiet_since = quiet_since or step
        else:
            quiet_since = None
            bal.apply(decisions)
    assert quiet_since is not None and quiet_since < 300
    assert bal.load_ratio() <= 1.15
    held = bal.placement.shard_bytes()
    assert held[2] < 0.5 * held[0]  # the slow shard ends with far fewer bytes


def test_migration_never_costs_more_than_it_saves() -> None:
    slow = [1e-9, 1e-9, 3e-9]
    pricey = PsldBalancer(3, _placement(), migration_s_per_byte=1.0)  # 1 s per byte moved
    _feed(pricey, slow, 10)
    out = pricey.decide(10)
    assert isinstance(out[0], NoChange) and "does not pay" in out[0].reason
    # measured pauses teach the model: a cheap measured migration unlocks the same plan
    pricey.observe_migration(1_000_000, 1e-4)
    _feed(pricey, slow, 60)
    assert isinstance(pricey.decide(60)[0], Move)


def test_balanced_cluster_gets_no_change() -> None:
    bal = PsldBalancer(3, _placement())
    _feed(bal, [1e-9] * 3, 10)
    out = bal.decide(10)
    assert len(out) == 1 and isinstance(out[0], NoChange)


def test_elastic_scale_out_when_every_shard_is_saturated() -> None:
    pl = _placement(2, num_blocks=40)
    rigid = PsldBalancer(2, pl)
    _feed(rigid, [1e-9] * 2, 10, busy_fraction=1.0)
    assert isinstance(rigid.decide(10)[0], NoChange)  # elastic is off
    bal = PsldBalancer(2, pl, elastic=True)
    _feed(bal, [1e-9] * 2, 10, busy_fraction=1.0)
    out = bal.decide(10)
    assert out[0] == AddShard() and len(out) > 1
    assert all(isinstance(d, Move) and d.dst == 2 for d in out[1:])
    new = bal.apply(out)
    assert new.num_shards == 3 and bal.model.num_shards == 3
    held = new.shard_bytes()
    assert max(held) / min(held) < 1.3
    # not saturated: no scale-out
    calm = PsldBalancer(2, pl, elastic=True)
    _feed(calm, [1e-9] * 2, 10, busy_fraction=0.5)
    assert isinstance(calm.decide(10)[0], NoChange)


def test_elastic_scale_in_drains_the_costliest_idle_shard() -> None:
    pl = _placement(3)
    bal = PsldBalancer(3, pl, elastic=True, min_shards=2)
    _feed(bal, [1e-9, 1.01e-9, 1e-9], 10, busy_fraction=0.05)
    out = bal.decide(10)
    assert out[-1] == RemoveShard(1)
    assert all(isinstance(d, Move) and d.src == 1 and d.dst in (0, 2) for d in out[:-1])
    assert len(out) - 1 == len(pl.blocks_on(1))
    new = bal.apply(out)
    assert new.num_shards == 2 and sum(new.shard_bytes()) == sum(pl.shard_bytes())
    for step in (100, 200):  # at min_shards: no further removal
        _feed(bal, [1e-9, 1e-9], step, busy_fraction=0.05)
        assert not any(isinstance(d, RemoveShard) for d in bal.decide(step))


def test_add_and_remove_on_command() -> None:
    pl = _placement(2, num_blocks=8)
    bal = PsldBalancer(2, pl, max_shards=3)
    _feed(bal, [1e-9] * 2, 10)
    added = bal.add_shard()
    assert added[0] == AddShard() and bal.apply(added).num_shards == 3
    with pytest.raises(UserInputError, match="maximum"):
        bal.add_shard()
    removal = bal.remove_shard(0)
    assert removal[-1] == RemoveShard(0)
    assert bal.apply(removal).num_shards == 2
    assert bal.apply(bal.remove_shard(1)).num_shards == 1
    with pytest.raises(UserInputError, match="last"):
        bal.remove_shard(0)
    with pytest.raises(UserInputError):
        bal.plan_drain(5)
