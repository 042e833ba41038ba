"""The run controller with an all-reduce topology, driven by the fake driver: the group is formed once the first
wave is up, re-formed at a new epoch on every loss, departure and join, healed from the survivor furthest on, and
restored from the newest checkpoint only when no member of the old group is left."""

from __future__ import annotations

from test_divergence import nan_at
from test_run_controller import finished, make

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.allreduce_topology import AllReduceTopology


def test_the_first_group_is_formed_once_and_every_step_waits_for_all_members():
    d = make(steps=120, workers=3, topology="allreduce")
    assert isinstance(d.controller.topology, AllReduceTopology)
    d.run()
    finished(d)
    (first,) = d.regroups
    assert (first.epoch, first.members, first.root, first.checkpoint) == (1, (0, 1, 2), 0, None)
    assert d.steps_lost == 0 and not d.of(C.Restore)


def test_a_lost_member_regroups_the_survivors_and_its_replacement_joins_healed_from_a_peer():
    d = make(steps=200, workers=3, topology="allreduce", revocations="trace=20@1", checkpoint_every=50)
    d.run()
    finished(d)
    epochs = [(c.epoch, c.members) for c in d.regroups]
    assert epochs == [(1, (0, 1, 2)), (2, (0, 2)), (3, (0, 2, 3))], epochs
    assert all(c.root in (0, 2) for c in d.regroups[1:])  # healed from a survivor: never from storage
    assert d.steps_lost == 0 and not d.of(C.Restore)
    assert [c.n for c in d.of(C.SetRoundSize)] == [2, 3]


def test_a_noticed_member_leaves_at_a_step_boundary_and_nothing_is_lost():
    d = make(steps=200, workers=3, topology="allreduce", checkpoint_every=100)
    d.on_step[60] = lambda d: d.notice(2)
    d.run()
    finished(d)
    assert [c.members for c in d.regroups][:2] == [(0, 1, 2), (0, 1)]
    assert d.steps_lost == 0


def test_every_member_lost_at_once_goes_back_to_the_newest_checkpoint():
    d = make(steps=200, workers=2, topology="allreduce", revocations="trace=40@0+40@1", checkpoint_every=25)
    d.run()
    finished(d)
    restored = [c for c in d.regroups if c.root is None]
    # the first replacement up trains on from the checkpoint at once; the second joins healed from it
    assert [(c.members, c.root) for c in d.regroups[1:]] == [((2,), None), ((2, 3), 2)]
    assert restored[0].checkpoint == 25  # revoked at step 40: the newest stored then
    assert "no member of the last group is left" in restored[0].why
    assert d.steps_lost == 40 - 25


def test_no_member_left_and_no_replacement_ends_the_run_naming_the_newest_checkpoint():
    d = make(steps=200, workers=2, topology="allreduce", revocations="trace=40@0+40@1", replacement="none",
             checkpoint_every=25)
    end = d.run()
    assert end.status == "failed" and "no worker left" in end.message
    assert "the latest checkpoint is step" in end.message and "\n" not in end.message


def test_a_diverged_group_goes_back_to_the_newest_checkpoint_with_a_lower_learning_rate():
    d = make(steps=300, workers=2, topology="allreduce", checkpoint_every=50, max_rollbacks=2)
    seen = nan_at(d, 120)
    end = d.run()
    finished(d)
    assert end.status == "finished" and seen == [120]
    (back,) = [c for c in d.regroups if c.root is None]
    assert (back.members, back.checkpoint, back.reason) == ((0, 1), 100, "diverged")
    assert d.steps_lost == 20 and not d.of(C.Restore)
    assert [c.scale for c in d.of(C.SetLrScale)][-1] == 0.5


def test_every_member_lost_at_the_last_step_trains_the_lost_steps_again_before_the_final_duties():
    """The group's state lives in its members: lost with the last of them at the target step, it comes back from
    the newest checkpoint and the lost steps are trained again; the final checkpoint and evaluation run on a member
    healed into the group, never on a newcomer's fresh model (before: the run finished on the newcomer's)."""
    d = make(steps=200, workers=2, topology="allreduce", revocations="trace=200@0+200@1", checkpoint_every=25)
    d.run()
    finished(d)
    assert [(c.members, c.root, c.checkpoint) for c in d.regroups[1:]] == [((2,), None, 175), ((2, 3), 2, None)]
    assert d.steps_lost == 25
    final = [(c.kind, c.worker_id) for c in d.of(C.StartDuty) if c.final]
    assert {kind for kind, _ in final} == {"checkpoint", "eval"} and {w for _, w in final} == {2}


def test_a_collective_that_fails_with_every_member_answering_forms_the_same_group_again():
    d = make(steps=200, workers=2, topology="allreduce", checkpoint_every=50)

    def broken(d) -> None:
        d.feed(E.GroupBroken(wall=d.wall, worker_id=1, detail="Connection reset by peer"))

    d.on_step[80] = broken
    d.run()
    finished(d)
    assert [(c.epoch, c.members) for c in d.regroups] == [(1, (0, 1)), (2, (0, 1))]
    assert d.regroups[1].root in (0, 1) and d.regroups[1].checkpoint is None  # healed from the furthest on
    assert "its collective failed: Connection reset by peer" in d.regroups[1].why
    assert d.steps_lost == 0
