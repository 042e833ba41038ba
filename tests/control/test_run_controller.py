"""The run controller driven by a fake driver: whole runs in milliseconds, no Ray, no SimPy, no sleep.

Emulated time: every worker step is ``STEP_S`` cloud seconds, so with two workers cloud time is
``global step / 2`` (revocation schedules below are in cloud seconds and fall at known steps).
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_driver import FakeDriver

from cmdare.cloud.servers import ServerSpec
from cmdare.control import MembershipKernel, PsServerKernel, RevocationPlan, build_revocation_source
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.balancers import DecisionSource, add_shard_moves, drain_moves
from cmdare.control.controller import RunController
from cmdare.control.emulated_clock import EmulatedClock
from cmdare.control.run_config import RunConfig
from cmdare.control.run_state import RunState
from cmdare.control.shard_control import UPLOAD_WAIT_S
from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import get_placement
from cmdare.ps.psld.decisions import AddShard, Move, RemoveShard, apply_decisions

K80 = ServerSpec("k80", "gcp", "us-east1", True, 0.14)
V100 = ServerSpec("v100", "gcp", "us-east1", True, 0.74)
PS = ServerSpec(None, "gcp", "us-east1", False, 0.05, role="ps")
SPOT_PS = ServerSpec(None, "gcp", "us-east1", True, 0.02, role="ps")


def make(steps=200, workers=2, revocations="none", replacement="same", sync=False, checkpoint_every=50,
         eval_every=0, ps=1, ps_transient=False, emulated=True, specs=None, ps_spec=None, start_step=0,
         lr_policy="unchanged", offers=None, driver_kw=None, saved=None, controller_kw=None, **config_kw) -> FakeDriver:
    plan = RevocationPlan.parse(revocations, seed=1)
    source = build_revocation_source(plan, np.random.default_rng(plan.seed))
    kernel = MembershipKernel(workers, replacement=replacement, lr_policy=lr_policy, revocations=source,
                              offers=offers)
    ps_kernel = PsServerKernel(source if ps_transient and plan.hits("ps") else None,
                               notice_s=plan.notice_lead_s(), replace=replacement != "none")
    config = RunConfig(steps=steps, workers=workers, sync=sync, checkpoint_every=checkpoint_every,
                       eval_every=eval_every, hit_workers=plan.hits("worker"), hit_ps=ps_transient and plan.hits("ps"),
                       ps_notice_s=plan.notice_lead_s(), step_s={"*": 1.0}, run_id="r", **config_kw)
    controller = RunController(config, kernel, ps_kernel, EmulatedClock() if emulated else None,
                               **(controller_kw or {}))
    controller.restore_state(saved)  # a resumed run: the state stored with its checkpoint
    driver = FakeDriver(controller, **(driver_kw or {}))
    driver.start(specs or [K80] * workers, ps_spec or (SPOT_PS if ps_transient else PS), ps, start_step)
    return driver


def finished(d: FakeDriver) -> None:
    assert d.ended is not None and d.ended.status == "finished", d.ended
    assert d.step == d.controller.config.steps


def duty_steps(d: FakeDriver, kind: str) -> list[int]:
    return [c.step for c in d.of(C.StartDuty) if c.kind == kind]


# -- duties ---------------------------------------------------------------------------------------------
def test_duties_run_at_the_steps_the_schedule_names_and_the_run_ends_with_the_final_ones():
    d = make(steps=200, checkpoint_every=50, eval_every=40)
    d.run()
    finished(d)
    assert duty_steps(d, "checkpoint") == [50, 100, 150, 200]
    assert duty_steps(d, "eval") == [40, 80, 120, 160, 200]
    # each periodic duty saw exactly its step: the workers were stopped there
    assert [s for s, c in d.at(C.StartDuty) if not c.final] == [c.step for c in d.of(C.StartDuty) if not c.final]
    assert d.stored == [50, 100, 150, 200]
    assert [s for _, _, s in d.controller.transitions] == [RunState.RUNNING, RunState.FINISHING, RunState.FINISHED]


def test_resume_counts_duties_from_the_checkpoint_step():
    d = make(steps=300, checkpoint_every=80, start_step=120)
    d.run()
    finished(d)
    assert duty_steps(d, "checkpoint") == [160, 240, 300]


def test_a_duty_cut_short_by_the_chiefs_loss_is_run_by_the_next_chief_for_the_same_step():
    d = make(steps=120, checkpoint_every=50, driver_kw={"action_wall_s": 1.0})
    d.on_step[50] = lambda d: d.later(0.5, lambda: d.kill(0))  # the chief dies during its checkpoint
    d.run()
    finished(d)
    ckpts = [(c.worker_id, c.step) for c in d.of(C.StartDuty) if c.kind == "checkpoint"]
    assert ckpts[0] == (0, 50) and (1, 50) in ckpts
    assert 50 in d.stored and [s for s, c in d.at(C.LoseWorker)] and d.of(C.LoseWorker)[0].worker_id == 0


# -- workers ----------------------------------------------------------------------------------------------
def test_a_revoked_worker_is_replaced_and_the_chief_moves():
    d = make(steps=200, revocations="trace=20@0")  # slot 0 (the chief) at cloud 20 s = step 40
    d.run()
    finished(d)
    (revoke_step, revoke), = d.at(C.Revoke)
    assert revoke.worker_id == 0 and revoke_step == 40
    chiefs = [c.worker_id for c in d.of(C.SetChief)]
    assert chiefs == [0, 1]
    (start,) = [c for c in d.of(C.StartWorker) if c.replaces is not None]
    assert (start.slot, start.replaces, start.spec) == (0, 0, K80)
    kinds = [e.kind for e in d.controller.kernel.timeline]
    assert kinds.count("join") == 3 and kinds.count("loss") == 1


def test_revocations_fall_at_the_same_steps_however_slow_the_emulator_is():
    def revocation_steps(**driver_kw):
        d = make(steps=600, workers=3, revocations="lifetime=exponential,speedup=2000", driver_kw=driver_kw)
        d.run()
        finished(d)
        return [(s, c.worker_id) for s, c in d.at(C.Revoke)]

    fast = revocation_steps(step_wall_s=0.001, up_wall_s=0.1)
    slow = revocation_steps(step_wall_s=0.05, up_wall_s=8.0)  # 50x slower steps, 80x slower process starts
    assert len(fast) >= 2 and fast == slow


@pytest.mark.parametrize("line, driver_kw, joins, steps", [
    (dict(revocations="trace=20@0"), {"startup_s": 3.0}, "Joined", (40, 43)),  # asked at 20 s, ready at 23 s
    (dict(revocations="trace=20@0", sync=True), {"startup_s": 3.0}, "Joined", (20, 23)),  # a round per second
    (dict(ps=2, ps_transient=True, revocations="trace=30@ps,notice=10,hit=ps"), {"ps_startup_s": 5.0}, "FillPs",
     (60, 70)),
])
def test_an_emulated_run_never_lowers_its_fence_when_it_asks_for_a_server(line, driver_kw, joins, steps):
    """A replacement's ready time is known only once the driver answers its start (``ServerStarting``, right
    after the command): until then training is fenced at the next step, so the fence its ready time sets is never
    below one that chunks already went out with (the emulator's shards would learn of a lowered fence only after
    pushes past it: a Ray run joined its replacement up to four steps late under load)."""
    d = make(steps=200, **line, driver_kw=driver_kw)
    d.run()
    finished(d)
    fences = [c.step for c in d.of(C.Fence)]
    assert fences == sorted(fences)
    (asked, _), = [(s, c) for s, c in d.at(C.StartWorker if joins == "Joined" else C.StartPs)
                   if getattr(c, "replaces", True) is not None]
    (joined, _), = d.at(getattr(C, joins))
    assert (asked, joined) == steps


def test_a_synchronous_round_grows_at_the_step_its_newcomer_is_ready_however_slow_its_process_starts():
    """Emulation: the round holds at the step the newcomer's emulated start-up ends until its process is up, then
    grows there (before, survivors trained on in rounds of one until the process was up, steps the simulator,
    whose newcomer is up when ready, never took)."""
    def decisions(up_wall_s):
        d = make(steps=200, revocations="trace=20@0", sync=True,
                 driver_kw={"startup_s": 3.0, "replacement_up_wall_s": up_wall_s})
        d.run()
        finished(d)
        return [(s, type(c).__name__, getattr(c, "n", None)) for s, c in d.at(C.Command)
                if isinstance(c, C.Revoke | C.Joined | C.SetRoundSize)]

    slow = decisions(30.0)  # 30 wall seconds: 300 survivor rounds of the fake world
    assert slow == [(20, "Revoke", None), (20, "SetRoundSize", 1), (23, "Joined", None), (23, "SetRoundSize", 2)]
    assert decisions(0.01) == slow


def test_a_worker_notice_checkpoints_on_the_chief_then_it_leaves_and_is_replaced():
    d = make(steps=200, checkpoint_every=100)
    d.on_step[60] = lambda d: d.notice(0)
    d.run()
    finished(d)
    notice_ckpt = [c for c in d.of(C.StartDuty) if c.reason == "notice"]
    assert [(c.worker_id, c.kind) for c in notice_ckpt] == [(0, "checkpoint")]
    released = d.of(C.ReleaseWorker)
    assert [c.worker_id for c in released] == [0]
    # it left after its checkpoint, then the chief moved and a replacement came for its slot
    order = [type(c).__name__ for c in d.commands if isinstance(c, C.StartDuty | C.ReleaseWorker | C.SetChief)]
    assert order.index("ReleaseWorker") > order.index("StartDuty")
    assert [c.slot for c in d.of(C.StartWorker) if c.replaces == 0] == [0]


def test_no_worker_left_and_no_replacement_ends_the_run_with_one_line():
    d = make(steps=200, workers=1, revocations="trace=20@0", replacement="none")
    end = d.run()
    assert end.status == "failed" and "no worker left" in end.message
    assert "no checkpoint was stored; there is nothing to resume: start the run again" in end.message  # not --resume
    assert "\n" not in end.message


def test_a_worker_that_cannot_start_ends_the_run_with_its_own_message():
    d = make(steps=200, revocations="trace=10@0", driver_kw={"fail_start": {2: "--batch-size 5000 is larger "
                                                                              "than the 1437 training samples"}})
    end = d.run()
    assert end.status == "failed" and "worker 2 could not start" in end.message and "--batch-size 5000" in end.message
    assert len(d.of(C.StartWorker)) == 3  # no second replacement after a deterministic failure


def test_both_synchronous_workers_revoked_at_once_recover():
    d = make(steps=120, sync=True, revocations="trace=5@0+5@1", checkpoint_every=0)
    d.run()
    finished(d)
    assert len(d.of(C.Revoke)) == 2 and len([c for c in d.of(C.StartWorker) if c.replaces is not None]) == 2
    sizes = [c.n for c in d.of(C.SetRoundSize)]
    assert sizes[0] == 1 and sizes[-1] == 2  # shrunk to one, grown back (with a wait) when both were up
    assert any(c.wait for c in d.of(C.SetRoundSize))


def test_replacement_timeout_falls_back_to_the_cheapest_other_type_on_a_real_cluster():
    from cmdare.control import Offer

    offers = [Offer(ServerSpec("k80", "gcp", "us-east1", True, 0.14), 1.0),
              Offer(ServerSpec("t4", "gcp", "us-east1", True, 0.11), 2.0)]
    d = make(steps=20000, revocations="trace=5@0", replacement="cheapest", emulated=False, admit_on_up=True,
             trained_on_join=False, replacement_timeout_s=30.0, offers=lambda lost: offers,
             driver_kw={"replacement_up_wall_s": 60.0, "real_time": True})  # nodes come after a minute: too late
    d.run(max_wall=100)
    starts = [c for c in d.of(C.StartWorker) if c.replaces is not None]
    assert [c.spec.gpu_type for c in starts][:2] == ["t4", "k80"]
    assert [c.worker_id for c in d.of(C.CancelWorker)][:1] == [starts[0].worker_id]


# -- parameter servers ------------------------------------------------------------------------------------
def test_ps_notice_with_survivors_evacuates_then_a_replacement_fills():
    d = make(steps=300, ps=2, ps_transient=True, revocations="trace=30@ps,notice=10,hit=ps")
    d.run()
    finished(d)
    names = [type(c).__name__ for c in d.commands if isinstance(c, C.EvacuatePs | C.StartPs | C.FillPs | C.HoldAll)]
    assert "EvacuatePs" in names and "StartPs" in names and "FillPs" in names
    (evac,) = d.of(C.EvacuatePs)
    assert evac.onto == "survivors" and d.steps_lost == 0


class _AllOntoOneShard(DecisionSource):
    """A placement source with plans of its own: a leaving shard's blocks all go to one shard; a replacement
    takes one block."""

    def drain(self, placement, shard):
        dst = 0 if shard else 1
        return [*(Move(b.block_id, shard, dst) for b in placement.blocks_on(shard)), RemoveShard(shard)]

    def fill(self, placement):
        return [AddShard(), Move(placement.blocks_on(0)[0].block_id, 0, placement.num_shards)]


def test_the_controller_decides_where_an_evacuated_shards_blocks_go_and_what_its_replacement_takes():
    """Three shards; the noticed one's blocks go to the least-loaded survivors and its shard is removed (the
    indices above it shift down); its replacement is added last and takes its share by bytes. A placement
    source's own plans instead where the run has one (PSLD's: ``--placement psld``)."""
    infos = param_infos([(f"layer{i}.weight", (64, 8 * (i + 1))) for i in range(9)])
    placement = get_placement("round-robin").place(infos, 3)
    for source in (None, _AllOntoOneShard()):
        d = make(steps=300, ps=3, ps_transient=True, revocations="trace=30@ps,notice=10,hit=ps",
                 controller_kw={"placement": placement, "balancer": source}, driver_kw={"placement": placement})
        d.run()
        finished(d)
        (evac,) = d.of(C.EvacuatePs)
        shard = [-1, -2, -3].index(evac.key)
        planned = (drain_moves(placement, shard) + [RemoveShard(shard)] if source is None
                   else source.drain(placement, shard))
        assert evac.moves == tuple(planned)
        (fill,) = d.of(C.FillPs)
        after = apply_decisions(placement, planned)
        assert fill.moves == tuple(add_shard_moves(after) if source is None else source.fill(after))
        # the controller's shard order is the placement's: the noticed shard's place gone, the replacement last
        assert d.controller.topology.shards.order == [k for k in (-1, -2, -3) if k != evac.key] + [fill.spare]
        assert d.placement.num_shards == 3 and d.controller.topology.placement is d.placement


def test_last_shard_moves_onto_its_replacement_when_it_is_ready_in_time():
    d = make(steps=300, ps=1, ps_transient=True, revocations="trace=30@ps,notice=100,hit=ps",
             driver_kw={"ps_startup_s": 5.0})
    d.run()
    finished(d)
    (evac,) = d.of(C.EvacuatePs)
    assert evac.onto == "replacement" and evac.spare is not None and not d.of(C.ParkPs)


def test_a_late_replacement_parks_the_last_shard_and_nothing_is_lost():
    d = make(steps=300, ps=1, ps_transient=True, revocations="trace=30@ps,notice=10,hit=ps",
             driver_kw={"ps_startup_s": 60.0})
    d.run()
    finished(d)
    (park,) = d.of(C.ParkPs)
    (unpark,) = d.of(C.UnparkPs)
    assert unpark.key == park.key and d.steps_lost == 0 and not d.of(C.Restore)
    # parked at half the notice: cloud 30 + 5 s (step 70)
    assert [s for s, c in d.at(C.ParkPs)] == [70]


def wall_of(d: FakeDriver, command: C.Command) -> float:
    """The wall time the driver carried ``command`` out at."""
    return next(w for w, _s, c in d.log if c is command)


def test_without_notice_the_shards_roll_back_to_the_latest_checkpoint():
    d = make(steps=300, ps=1, ps_transient=True, checkpoint_every=40, revocations="trace=45@ps,notice=0,hit=ps")
    d.run()
    finished(d)
    (kill,) = d.of(C.KillPs)
    assert kill.reason == "no_notice"
    (restore,) = d.of(C.Restore)
    (start_ps,) = d.of(C.StartPs)
    # the controller names the checkpoint and which server takes the dead one's place
    assert restore.checkpoint == 80 and restore.replacements == ((kill.key, start_ps.key),)
    assert d.steps_lost == 90 - 80
    # duties start again after the checkpoint the shards rolled back to
    assert duty_steps(d, "checkpoint") == [40, 80, 120, 160, 200, 240, 280, 300]


def test_a_restore_waits_for_the_checkpoint_on_its_way_to_storage():
    """The PS dies at step 90 while the checkpoint of step 80 is uploading: the restore waits for it rather than
    go back to step 40 (the newest checkpoint stored when the PS died)."""
    d = make(steps=300, ps=1, ps_transient=True, checkpoint_every=40, revocations="trace=45@ps,notice=0,hit=ps",
             driver_kw={"slow_uploads": {80: 30.0}})
    d.run()
    finished(d)
    (restore,) = d.of(C.Restore)
    (kill,) = d.of(C.KillPs)
    assert restore.checkpoint == 80 and d.steps_lost == 90 - 80
    assert wall_of(d, restore) - wall_of(d, kill) >= 29.0


def test_a_restore_waits_for_a_stalled_upload_only_so_long():
    """The upload of step 80 never ends: the restore goes back to step 40 once it has waited UPLOAD_WAIT_S."""
    d = make(steps=300, ps=1, ps_transient=True, checkpoint_every=40, revocations="trace=45@ps,notice=0,hit=ps",
             driver_kw={"stalled_uploads": {80}})
    d.run()
    (restore,) = d.of(C.Restore)
    (kill,) = d.of(C.KillPs)
    assert restore.checkpoint == 40 and d.steps_lost == 90 - 40
    assert UPLOAD_WAIT_S <= wall_of(d, restore) - wall_of(d, kill) <= UPLOAD_WAIT_S + 5


def test_a_restore_before_any_checkpoint_names_the_start():
    d = make(steps=200, ps=1, ps_transient=True, checkpoint_every=100, revocations="trace=20@ps,notice=0,hit=ps")
    d.run()
    finished(d)
    (restore,) = d.of(C.Restore)
    assert restore.checkpoint is None and d.steps_lost == 40


def test_a_replacement_ps_up_during_the_chiefs_duty_does_not_strand_a_synchronous_round():
    """The CLI hang (1 run in 3 to 6): at a barrier the chief took its checkpoint and worker 1 alone was told to
    train; it pushed and waited at the shards' barrier for the chief. The replacement PS came up meanwhile: a
    FillPs hold, which waits for every worker to stop, so the chief was never told to train and worker 1 never
    stopped. A synchronous round starts with all its workers: nobody trains while a member is busy. (The replacement's
    emulated start-up ends at step 50.5: its fill comes at step 51, once its process is up, as in the simulator.)"""
    d = make(steps=200, sync=True, ps=2, ps_transient=True, checkpoint_every=50, revocations="trace=30@ps,notice=10,"
             "hit=ps", driver_kw={"ps_up_wall_s": float("inf"), "ps_startup_s": 20.5})
    # the replacement requested at the notice (step 30) comes up as the chief's checkpoint of step 50 ends
    d.on_duty[50] = lambda d: d.feed(E.PsUp(wall=d.wall, key=d.of(C.StartPs)[-1].key))
    d.run(max_wall=100)
    finished(d)
    assert [s for s, c in d.at(C.FillPs)] == [51] and d.steps_lost == 0
    # the workers of a synchronous round are told to train together, never one alone
    told: dict[float, set[int]] = {}
    for wall, _step, c in d.log:
        if isinstance(c, C.Train):
            told.setdefault(wall, set()).add(c.worker_id)
    assert told and all(ids == {0, 1} for ids in told.values())


def test_placement_changes_wait_for_quiesced_shards():
    d = make(steps=200)
    d.on_step[50] = lambda d: d.feed(E.PlacementRequested(wall=d.wall, decisions=("move",)))
    d.run()
    finished(d)
    names = [type(c).__name__ for c in d.commands]
    hold = names.index("HoldAll")
    assert names.index("ChangePlacement") > hold
    assert d.of(C.ChangePlacement)[0].decisions == ("move",)


def test_a_failed_checkpoint_upload_keeps_the_previous_one():
    d = make(steps=100, checkpoint_every=50)
    d.feed(E.CheckpointFailed(wall=d.wall, step=50, error="disk full"))
    d.run()
    assert d.controller.duties.failed == [50]


def test_a_final_checkpoint_that_cannot_be_stored_fails_the_run_and_names_the_last_stored_one():
    """Issue 29: storage full at the end ended 'finished', exit 0, one warning, over lost work."""
    d = make(steps=100, checkpoint_every=50, driver_kw={"failing_uploads": {100}})
    end = d.run()
    assert end.status == "failed" and d.stored == [50]
    assert end.message == ("the final checkpoint (step 100) could not be stored (No space left on device); the latest "
                           "checkpoint is step 50; resume with --resume r")


def test_the_end_waits_for_the_final_upload_and_fails_when_it_never_ends():
    d = make(steps=100, checkpoint_every=50, stuck_after_s=30.0, driver_kw={"stalled_uploads": {100}})
    end = d.run(max_wall=100)
    assert end.status == "failed" and "the final checkpoint (step 100) was not stored within 30 s" in end.message
    assert d.wall >= 30.0


def test_uploads_failing_in_a_row_stop_the_run_and_one_stored_between_resets_the_count():
    d = make(steps=400, checkpoint_every=50, max_failed_uploads=3, driver_kw={"failing_uploads": {100, 150, 200}})
    end = d.run()
    assert end.status == "failed" and d.step < 250 and d.stored == [50]
    assert end.message.startswith("3 checkpoint uploads in a row failed (the last, of step 200: No space left on "
                                  "device); training stopped rather than go on with nothing stored; the latest "
                                  "checkpoint is step 50")
    d = make(steps=400, checkpoint_every=50, max_failed_uploads=3, driver_kw={"failing_uploads": {100, 150, 250}})
    d.run()
    finished(d)
    assert d.controller.duties.failed == [100, 150, 250]


# -- liveness -------------------------------------------------------------------------------------------
def test_a_silent_cluster_is_probed_and_a_lost_one_ends_the_run():
    d = make(steps=200, probe_after_s=5.0)
    d.on_step[30] = lambda d: setattr(d, "stuck", True)
    end = d.run(max_wall=100)
    assert d.of(C.Probe) and end.status == "failed" and "marked dead" in end.message


def test_a_frozen_shard_found_by_a_probe_is_restored_and_not_probed_again_at_once():
    """A probe that found a frozen shard (and ended it) was followed by another at once, and another: the driver
    never got back to Ray's results, and the run sat at one step in silence."""
    d = make(steps=200, checkpoint_every=50, probe_after_s=5.0)
    d.on_step[130] = lambda d: setattr(d, "frozen_shard", True)
    end = d.run(max_wall=100)
    finished(d)
    assert end.status == "finished" and [c.reason for c in d.of(C.Restore)] == ["lost"]
    assert len(d.probes) == 1 and d.steps_lost == 30  # back to the checkpoint of step 100


def test_no_progress_though_everything_answers_ends_the_run():
    d = make(steps=200, probe_after_s=2.0, stuck_after_s=20.0)
    d.on_step[30] = lambda d: setattr(d, "step_wall_s", 1e9)  # every worker hangs in its step
    end = d.run(max_wall=100)
    assert end.status == "failed" and "no training progress" in end.message and "step 30" in end.message


def test_controller_modules_use_no_clock_thread_ray_or_simpy():
    import ast
    from pathlib import Path

    import cmdare.control as control

    banned = {"time", "threading", "ray", "simpy", "asyncio"}
    for path in Path(control.__file__).parent.glob("*.py"):
        if path.name == "clock.py":  # the wall clock adapter of the legacy kernel API
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            assert not {n.split(".")[0] for n in names} & banned, (path.name, names)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"workers": 0}])
def test_bad_run_configs_are_refused(bad):
    from cmdare.errors import UserInputError

    with pytest.raises(UserInputError):
        RunConfig(**{"steps": 10, "workers": 1, **bad})


# -- a requested stop (Ctrl-C, SIGTERM) -----------------------------------------------------------------------------
def _stop_at(d: FakeDriver, step: int) -> None:
    d.on_step[step] = lambda d: d.feed(E.StopRequested(wall=d.wall, why="interrupted (SIGINT)"))


def test_a_requested_stop_stores_the_step_it_stops_at_and_ends_interrupted():
    """Ctrl-C exited 130 with no word: 131 steps were lost (the last checkpoint 200, interrupted at 331)."""
    d = make(steps=500, checkpoint_every=200, eval_every=100)
    _stop_at(d, 331)
    end = d.run()
    assert end.status == "interrupted"
    stopped = d.step
    assert 331 <= stopped <= 332 and d.stored == [200, stopped]  # nothing trained is lost
    assert end.message == (f"interrupted (SIGINT) at step {stopped}; the latest checkpoint is step {stopped}; "
                           "resume with --resume r")
    assert duty_steps(d, "eval") == [100, 200, 300]  # a stop runs no evaluation
    assert d.controller.state == RunState.INTERRUPTED


def test_a_stop_whose_checkpoint_is_not_stored_in_time_ends_naming_the_last_stored_one():
    d = make(steps=500, checkpoint_every=100, stop_timeout_s=30.0, driver_kw={"stalled_uploads": {250, 251}})
    _stop_at(d, 250)
    end = d.run(max_wall=10_000)
    assert end.status == "interrupted" and d.stored == [100, 200]
    assert end.message.startswith("interrupted (SIGINT) at step 25") and "was not stored within 30 s; the latest " \
        "checkpoint is step 200; resume with --resume r" in end.message


def test_a_stop_before_training_started_ends_at_once():
    d = make(steps=500, driver_kw={"up_wall_s": 50.0})
    d.later(1.0, E.StopRequested(wall=1.0, why="interrupted (SIGTERM)"))
    end = d.run()
    assert end.status == "interrupted" and d.step == 0
    assert end.message == "interrupted (SIGTERM) before training started; no checkpoint was stored; there is " \
                          "nothing to resume: start the run again"


def test_code_that_fails_on_a_worker_ends_the_run_with_its_line_and_replaces_nobody():
    """A chief whose evaluation raised (a test batch the model cannot take, a bug) was taken for revoked and
    replaced, and its replacement too, for ever."""
    d = make(steps=300, checkpoint_every=100)
    d.on_step[150] = lambda d: d.feed(E.CodeFailed(wall=d.wall, worker_id=0, error="--dataset p:d at step 150: "
                                                   "item 7 raised ValueError: bad record"))
    end = d.run()
    assert end.status == "failed" and end.message == ("--dataset p:d at step 150: item 7 raised ValueError: bad "
                                                      "record; the latest checkpoint is step 100; resume with "
                                                      "--resume r")
    assert not d.of(C.LoseWorker) and not d.of(C.StartWorker)[2:]  # the first wave only
