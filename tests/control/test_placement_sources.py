"""Placement changes decided by the controller's parameter-server topology (issue 43): the placement's sources
(a script, PSLD-like balancers, ``cmdare ps`` requests) see what the driver measures and the topology has their
decisions carried out on quiesced shards; the driver only measures and moves blocks."""

from __future__ import annotations

from test_run_controller import finished, make

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.balancers import DecisionSource, ScriptedSource
from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import RoundRobin
from cmdare.ps.psld.decisions import AddShard, Move


def _placement(shards: int = 2):
    return RoundRobin().place(param_infos([("a", (1000,)), ("b", (3000,)), ("c", (10,)), ("d", (500,))]), shards)


def test_a_scripted_source_is_asked_at_every_pass_and_its_moves_wait_for_quiesced_shards():
    placement = _placement()
    block = placement.blocks_on(0)[0].block_id
    source = ScriptedSource({30: [Move(block, 0, 1)]})
    d = make(steps=100, checkpoint_every=0, controller_kw={"balancer": source, "placement": placement})
    d.run()
    finished(d)
    ((step, change),) = d.at(C.ChangePlacement)
    assert step >= 30 and change.decisions == (Move(block, 0, 1),) and change.new_keys == ()
    assert "every pass" in change.why
    # the workers were held for it: every one stopped before the change, and trained on after it
    held = [i for i, c in enumerate(d.commands) if isinstance(c, C.HoldAll)]
    assert held and held[0] < d.commands.index(change)


class _Recording(DecisionSource):
    """Decides one move at its first balancing step; records what it observed and was told."""

    def __init__(self, move):
        self.move, self.seen, self.applied_ = move, [], []

    def observe(self, stats, global_step):
        self.seen.append((global_step, len(stats)))

    def decide(self, global_step, placement):
        decided, self.move = ([self.move] if self.move else []), None
        return decided

    def applied(self, decisions, placement, moved_bytes, pause_s):
        self.applied_.append((tuple(decisions), moved_bytes, pause_s))


def test_a_balancer_decides_on_the_loads_measured_at_a_balancing_step_and_learns_what_was_done():
    placement = _placement()
    move = Move(placement.blocks_on(1)[0].block_id, 1, 0)
    source = _Recording(move)
    d = make(steps=200, checkpoint_every=0, balance_every=50,
             controller_kw={"balancer": source, "placement": placement})
    d.on_step[120] = lambda d: d.feed(E.ShardLoads(wall=d.wall, global_step=120, stats=("s0", "s1")))  # periodic
    d.run()
    finished(d)
    assert [c.step for c in d.of(C.Balance)] == [50, 100, 150, 200]
    ((step, change),) = d.at(C.ChangePlacement)
    assert step >= 50 and change.decisions == (move,) and "balancing step 50" in change.why
    # a measurement is observed (the fake's answers to Balance measure nothing); a periodic one decides nothing
    assert source.seen == [(120, 2)]
    # the moves carried out reach the source with the action's end
    assert source.applied_ == [((move,), 1000, d.action_wall_s)]


def test_cmdare_ps_requests_become_decisions_against_the_placement_as_it_is():
    placement = _placement()
    d = make(steps=120, checkpoint_every=0, controller_kw={"placement": placement})
    d.on_step[40] = lambda d: d.feed(E.PlacementRequested(wall=d.wall, requests=({"action": "add"},)))
    d.run()
    finished(d)
    ((_step, change),) = d.at(C.ChangePlacement)
    assert isinstance(change.decisions[0], AddShard) and len(change.new_keys) == 1
    assert all(isinstance(m, Move) and m.dst == 2 for m in change.decisions[1:]) and "cmdare ps" in change.why
    assert d.num_shards == 2


def test_without_a_placement_a_request_changes_nothing():
    d = make(steps=80, checkpoint_every=0)
    d.on_step[20] = lambda d: d.feed(E.PlacementRequested(wall=d.wall, requests=({"action": "add"},)))
    d.run()
    finished(d)
    assert d.of(C.ChangePlacement) == []
