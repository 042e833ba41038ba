"""A non-finite loss: the run stops, or (``max_rollbacks``) rolls every shard back to the newest stored
checkpoint with a lower learning rate and trains on; nothing non-finite is stored. Fake driver, no Ray."""

from __future__ import annotations

import json

import pytest
from fake_driver import FakeDriver
from test_run_controller import finished, make

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.run_config import RunConfig
from cmdare.errors import UserInputError


def nan_at(d: FakeDriver, step: int, times: int = 1, worker_id: int = 0) -> list[int]:
    """A NaN loss is reported when training reaches ``step``, the first ``times`` times it does; returns the
    list the global steps of the reports go to."""
    seen: list[int] = []

    def report(d: FakeDriver) -> None:
        seen.append(d.step)
        d.feed(E.ChunkDone(wall=d.wall, worker_id=worker_id, global_step=d.step, steps=1, loss=float("nan")))
        if len(seen) < times:
            d.on_step[step] = report

    d.on_step[step] = report
    return seen


def test_a_non_finite_loss_ends_the_run_before_anything_more_is_stored():
    d = make(steps=200, checkpoint_every=50)
    nan_at(d, 120)
    end = d.run()
    assert end.status == "failed" and d.stored == [50, 100]
    assert end.message.startswith("training diverged: worker 0's loss is nan at step 120 (try a lower --lr, or "
                                  "--on-diverge rollback); nothing non-finite is stored; the latest checkpoint "
                                  "is step 100")
    assert not d.of(C.Restore)


def test_a_rollback_restores_the_newest_checkpoint_halves_the_learning_rate_and_trains_to_the_end():
    d = make(steps=300, checkpoint_every=50, max_rollbacks=2)
    seen = nan_at(d, 120)
    end = d.run()
    finished(d)
    assert end.status == "finished" and seen == [120]
    assert [c.reason for c in d.of(C.Restore)] == ["diverged"]
    assert d.steps_lost == 20  # back to step 100, the newest stored
    assert d.stored == [50, 100, 150, 200, 250, 300]
    assert [c.scale for c in d.of(C.SetLrScale)][-1] == 0.5
    assert d.controller.rollbacks == 1


def test_divergence_after_the_last_rollback_ends_the_run_and_says_how_often_it_rolled_back():
    d = make(steps=300, checkpoint_every=50, max_rollbacks=2)
    seen = nan_at(d, 120, times=3)
    end = d.run()
    assert seen == [120, 120, 120]
    assert len(d.of(C.Restore)) == 2
    assert [c.scale for c in d.of(C.SetLrScale) if c.scale < 1] == [0.5, 0.25]  # the factors multiply
    assert end.status == "failed"
    assert end.message.startswith("training diverged again after 2 rollback(s): worker 0's loss is nan at step "
                                  "120 (try a lower --lr); nothing non-finite is stored")
    assert d.stored == [50, 100]


def test_every_worker_reporting_nan_before_the_shards_quiesce_counts_as_one_rollback():
    d = make(steps=300, workers=3, checkpoint_every=50, max_rollbacks=1)
    d.on_step[70] = lambda d: [d.feed(E.ChunkDone(wall=d.wall, worker_id=w, global_step=d.step, steps=1,
                                                  loss=float("inf"))) for w in range(3)]
    end = d.run()
    finished(d)
    assert end.status == "finished" and d.controller.rollbacks == 1 and len(d.of(C.Restore)) == 1


def test_a_rollback_with_lr_scale_1_keeps_the_learning_rate():
    d = make(steps=200, checkpoint_every=50, max_rollbacks=1, rollback_lr_scale=1.0)
    nan_at(d, 120)
    d.run()
    finished(d)
    assert len(d.of(C.Restore)) == 1 and all(c.scale == 1.0 for c in d.of(C.SetLrScale))


@pytest.mark.parametrize("bad", [{"max_rollbacks": -1}, {"rollback_lr_scale": 0.0}, {"rollback_lr_scale": 1.5}])
def test_bad_rollback_settings_are_refused(bad):
    with pytest.raises(UserInputError):
        RunConfig(steps=10, workers=1, **bad)


# -- divergence while the loss is finite (issue 42) -----------------------------------------------------------------


def test_a_loss_that_explodes_but_stays_finite_is_divergence():
    """A regression's loss grew to 7.5e15 and the run ended 'finished': a loss 100x over its level diverged."""
    d = make(steps=300, checkpoint_every=50, driver_kw={"loss_at": lambda step: 2.0 if step < 120 else 3.0e5})
    # (the first chunk past step 120 ends at step 123)
    end = d.run()
    assert end.status == "failed" and d.stored == [50, 100]
    assert end.message.startswith("training diverged: worker 0's loss is 3e+05, over 100x its level of 2 at step 123"
                                  " (try a lower --lr, or --on-diverge rollback)"), end.message


def test_a_spike_below_the_bound_and_a_loss_that_falls_are_not_divergence():
    loss = {**{s: 2.3 * 0.98 ** s for s in range(301)}, 150: 150.0}  # a spike 65x the first loss: trains on
    d = make(steps=300, checkpoint_every=50, driver_kw={"loss_at": loss.__getitem__})
    d.run()
    finished(d)


def test_non_finite_parameters_under_a_finite_loss_roll_back():
    d = make(steps=300, checkpoint_every=50, max_rollbacks=1)
    d.on_step[120] = lambda d: d.feed(E.ChunkDone(wall=d.wall, worker_id=1, global_step=d.step, steps=1, loss=0.5,
                                                  params_finite=False))
    end = d.run()
    finished(d)
    assert end.status == "finished" and [c.reason for c in d.of(C.Restore)] == ["diverged"]
    assert d.steps_lost == 20


def test_a_worker_that_met_a_nan_loss_names_the_step_it_met_it_at():
    d = make(steps=300, checkpoint_every=50)
    d.on_step[57] = lambda d: d.feed(E.ChunkDone(wall=d.wall, worker_id=1, global_step=60, steps=0,
                                                 loss=float("nan"), diverged_at=57))
    end = d.run()
    assert end.message.startswith("training diverged: worker 1's loss is nan at step 57 ")


def test_an_exploded_test_loss_rolls_back_and_a_final_one_never_ends_finished():
    d = make(steps=300, checkpoint_every=50, eval_every=100, max_rollbacks=1,
             driver_kw={"loss_at": lambda step: 1.0, "test_loss": {200: 5.0e4}})
    d.run()
    finished(d)
    assert [c.reason for c in d.of(C.Restore)] == ["diverged"]
    d = make(steps=300, checkpoint_every=50, eval_every=100, max_rollbacks=1,
             driver_kw={"loss_at": lambda step: 1.0, "test_loss": {300: float("nan")}})
    end = d.run()
    assert end.status == "failed"
    assert end.message.startswith("training diverged: worker 0's test loss is nan at step 300"), end.message


def _nan_at_steps(d: FakeDriver, *steps: int) -> None:
    for step in steps:
        nan_at(d, step)


def test_a_resumed_run_counts_its_rollbacks_and_damps_its_learning_rate_as_the_uninterrupted_run():
    """The controller's state is stored with each checkpoint (``StartDuty.state``) and restored on resume (issue 43):
    the run stopped at step 200 and resumed decides as the run that never stopped. Without it the resumed run would
    roll back a third time with ``rollback:2`` and train at the full learning rate."""
    whole = make(steps=300, checkpoint_every=50, max_rollbacks=2)
    _nan_at_steps(whole, 120, 220, 270)
    end = whole.run()
    assert end.status == "failed" and end.message.startswith("training diverged again after 2 rollback(s): "
                                                             "worker 0's loss is nan at step 270")

    first = make(steps=200, checkpoint_every=50, max_rollbacks=2)
    _nan_at_steps(first, 120)
    assert first.run().status == "finished"
    (last,) = [c for c in first.of(C.StartDuty) if c.kind == "checkpoint" and c.step == 200]
    saved = json.loads(last.state)
    assert (saved["rollbacks"], saved["lr_damping"]) == (1, 0.5)

    resumed = make(steps=300, checkpoint_every=50, max_rollbacks=2, start_step=200, saved=saved)
    _nan_at_steps(resumed, 220, 270)
    again = resumed.run()
    assert (again.status, again.message) == (end.status, end.message)
    assert [c.scale for c in resumed.of(C.SetLrScale)] == [0.5, 0.25]  # from the start, then the second rollback
    assert [c.scale for c in whole.of(C.SetLrScale) if c.scale < 1] == [0.5, 0.25]
    # the decisions after step 200 are the uninterrupted run's
    after = [type(c).__name__ for w, s, c in whole.log if s > 200 and not isinstance(c, C.Train | C.Fence | C.HoldAll)]
    resumed_after = [type(c).__name__ for w, s, c in resumed.log
                     if s > 200 and not isinstance(c, C.Train | C.Fence | C.HoldAll)]
    assert resumed_after == after
