"""Warm spares decided by the controller (issue 43): how many, which one a replacement takes, another in its place,
and giving up on spares that never come up. The policy alone and whole runs with the fake driver; the trainer
(tests/train/test_warm_spares.py) and the simulator (tests/plan/test_train_simulate.py) carry the same commands out.
"""

from __future__ import annotations

from test_run_controller import K80, V100, finished, make

from cmdare.control import run_commands as C
from cmdare.control.spares import MAX_FAILED_STARTS, WarmSpares, spare_spec


def test_the_pool_takes_the_spare_up_longest_else_the_one_furthest_into_its_start_and_asks_for_another():
    out: list[C.Command] = []
    spares = WarmSpares(3, out)
    spares.start([K80, K80, V100], now=0.0)
    # the first wave's most common spec, asked for with the first wave (their start-up is no part of the run)
    assert [(c.key, c.spec, c.first_wave) for c in out] == [(0, K80, True), (1, K80, True), (2, K80, True)]
    spares.starting(0, 30.0, now=0.0)
    spares.starting(1, 10.0, now=0.0)
    spares.starting(2, 20.0, now=0.0)
    out.clear()
    taken = spares.take(K80)
    assert taken.key == 1  # none up: the one whose server is ready first
    spares.refill(taken, now=5.0)  # no spare's start known yet: topped up to the full size
    assert [(c.key, c.spec, c.first_wave) for c in out] == [(3, K80, False)]  # a refill starts in the run
    spares.up(2, now=20.0)
    spares.up(0, now=30.0)
    assert spares.take(K80).key == 2  # up longest
    assert spares.take(V100) is None  # no spare of that spec: a cold start
    assert spares.taken == 2 and sorted(spares.spares) == [0, 3]


def test_after_three_spares_in_a_row_die_before_they_are_up_no_more_are_asked_for():
    out: list[C.Command] = []
    spares = WarmSpares(1, out)
    spares.start([K80], now=0.0)
    for i in range(MAX_FAILED_STARTS - 1):
        spares.lost(i, now=1.0 + i)
        assert not spares.closed and out[-1] == C.StartSpare(i + 1, K80)
    spares.up(MAX_FAILED_STARTS - 1, now=5.0)  # one came up: the count starts again
    spares.lost(MAX_FAILED_STARTS - 1, now=6.0)
    assert spares.failed_starts == 0 and not spares.closed
    for _ in range(MAX_FAILED_STARTS):
        spares.lost(max(spares.spares), now=7.0)
    assert spares.closed and not spares.spares
    assert spares.take(K80) is None


def test_the_spares_spec_is_the_first_waves_most_common_one():
    assert spare_spec([V100, K80, K80]) == K80
    assert spare_spec([V100, K80]) == V100  # a tie: the lowest slot's


def test_a_replacement_takes_a_warm_spare_and_the_pool_keeps_one_for_rare_losses():
    # two losses 100 cloud seconds apart, a spare's start 1.5 s
    d = make(steps=600, revocations="trace=20@0+120@1", warm_spares=2, driver_kw={"startup_s": 1.5})
    d.run()
    finished(d)
    # the first loss: no spare's start timed yet (the first wave's are not), so the pool is topped up to its size
    # (spare 2); the second: a start of 1.5 s and 0.02 losses expected within it: the pool keeps one spare, so none
    # is asked for in the taken one's place (a second would only bill)
    assert [c.key for c in d.of(C.StartSpare)] == [0, 1, 2]
    starts = [c for c in d.of(C.StartWorker) if c.replaces is not None]
    assert [c.spare for c in starts] == [0, 1] and "on warm spare 0" in starts[0].why
    # the spares were up: each replacement adopted its process at once and its slot was empty for no cloud time
    assert [j.recovery_s for j in d.of(C.Joined)] == [0.0, 0.0]
    assert d.controller.spares.start_s() == 1.5 and d.controller.spares.wanted(d.controller.now) == 1


def test_losses_faster_than_a_spare_starts_keep_the_pool_full_and_refill_it_at_once():
    # three losses a cloud second apart, each spare's start 1.5 s: the pool stays at its size, each take refilled
    d = make(steps=400, workers=3, revocations="trace=2@0+3@1+4@2", warm_spares=2, driver_kw={"startup_s": 1.5})
    d.run()
    finished(d)
    takes = [c for c in d.of(C.StartWorker) if c.replaces is not None]
    assert len(takes) == 3 and all(c.spare is not None for c in takes)
    refills = [c for c in d.of(C.StartSpare) if not c.first_wave]
    assert len(refills) == 3
    for take in takes:  # each refill asked for in the same decision pass as the take
        after = d.commands[d.commands.index(take) + 1]
        assert isinstance(after, C.StartSpare) and "topped up" in after.why


def test_the_pool_sizes_itself_from_the_deadlines_due_and_the_loss_rate_within_a_spares_start():
    out: list[C.Command] = []
    spares = WarmSpares(4, out)
    spares.start([K80, K80], now=0.0)
    assert spares.wanted(0.0) == 4  # no spare's start known yet: the full size
    for key in range(4):
        spares.starting(key, 0.0, now=0.0)
    spares.up(0, now=3.0)  # a first-wave spare: its start is no part of the run, not timed
    assert spares.start_s() is None
    spares.refill(spares.take(K80), now=0.0)  # the pool is topped up to its size: spare 4
    spares.starting(4, 10.0, now=0.0)  # an emulated start-up of 10 s
    spares.up(4, now=12.0)  # its process up 2 s after its modelled start-up: the model's 10 s count
    assert spares.start_s() == 10.0
    assert spares.wanted(12.0) == 1  # no loss seen, none due: one for the unforeseen
    assert spares.wanted(12.0, deadlines=[15.0, 21.0, 40.0]) == 3  # two members' lifetimes end within 10 s
    spares.worker_lost(14.0)
    spares.worker_lost(16.0)  # 2 losses in 16 s: 1.25 expected within a 10 s start -> 1, plus one
    assert spares.loss_rate(16.0) == 2 / 16 and spares.wanted(16.0) == 2
    spares.worker_lost(16.0)  # 3 in 16 s: 1.875 -> 2, plus one
    assert spares.wanted(16.0) == 3
    assert spares.wanted(16.0, deadlines=[17, 18, 19, 20, 21]) == 4  # never above the size
    # a start-up of 0 (emulated) says nothing of the start: the measured one counts
    out2: list[C.Command] = []
    measured = WarmSpares(2, out2)
    measured.start([K80], now=0.0)
    measured.refill(measured.take(K80), now=1.0)
    measured.starting(2, 0.0, now=1.0)
    measured.up(2, now=4.0)
    assert measured.start_s() == 3.0


def test_a_notice_asks_for_a_spare_at_once_up_to_the_size():
    out: list[C.Command] = []
    spares = WarmSpares(2, out)
    spares.start([K80], now=0.0)
    spares.take(K80)
    out.clear()
    spares.noticed(5.0)
    assert [(c.key, c.first_wave) for c in out] == [(2, False)] and "noticed" in out[0].why
    spares.noticed(6.0)  # the pool is at its size: no more
    assert len(out) == 1


def test_spares_that_never_come_up_are_given_up_and_replacements_start_cold():
    d = make(steps=200, revocations="trace=40@0", warm_spares=1,
             driver_kw={"dead_spares": {0, 1, 2, 3}, "up_wall_s": 0.05})  # all dead before the revocation
    d.run()
    finished(d)
    assert [c.key for c in d.of(C.StartSpare)] == [0, 1, 2]
    (close,) = d.of(C.CloseSpares)
    assert close.failed_starts == MAX_FAILED_STARTS and "no more are asked for" in close.why
    (start,) = [c for c in d.of(C.StartWorker) if c.replaces is not None]
    assert start.spare is None


def test_without_warm_spares_nothing_is_asked_for():
    d = make(steps=200, revocations="trace=20@0")
    d.run()
    finished(d)
    assert d.of(C.StartSpare) == [] and all(c.spare is None for c in d.of(C.StartWorker))


def test_a_rebalance_recommendation_asks_for_a_spare_at_once_and_the_worker_trains_on():
    from cmdare.control import run_events as E

    d = make(steps=600, revocations="trace=20@0+120@1", warm_spares=2, driver_kw={"startup_s": 1.5})
    d.on_step[400] = lambda d: d.feed(E.WorkerAtRisk(wall=d.wall, worker_id=2, provider="aws"))
    d.run()
    finished(d)
    # after the second loss the pool kept one spare (no loss expected within a start); the recommendation for
    # worker 2 (slot 0's replacement) asks for another at once
    spares = d.of(C.StartSpare)
    assert [c.key for c in spares] == [0, 1, 2, 3]
    assert "worker 2's server is at risk (aws rebalance recommendation)" in spares[3].why
    assert [step for _t, step, c in d.controller.history if c is spares[3]] == [400]
    assert not d.of(C.ReleaseWorker)  # no notice: worker 2 left nothing, it trained on
