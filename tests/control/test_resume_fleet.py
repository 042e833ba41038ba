"""Kill and resume: a run resumed from a checkpoint makes the decisions of the run that never stopped (issue 43).

The controller's state is stored with each checkpoint (``StartDuty.state``, JSON): in emulation the whole emulated
fleet (cloud time, every worker with its server, ready time and drawn lifetime, the replacements on their way, the
warm spares, the PS servers, the chief) and the revocation source's draws so far. Emulated time advances only with
training, so none passes while a run is stopped, and the resumed run goes on with that fleet. Each test runs a
whole run, then resumes it from one of its checkpoints (what a run killed after that checkpoint would do), and
compares every decision after the checkpoint: the same commands at the same steps, at the same cloud times (to
float rounding: cloud time is a sum of step times, added up chunk by chunk). Fake driver, no Ray.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_run_controller import make

from cmdare.control import run_commands as C

LIFETIMES = "lifetime=exponential,speedup=2000"
RUN = {"steps": 400, "workers": 4, "checkpoint_every": 50, "eval_every": 100,
       "driver_kw": {"startup_s": 6.0, "up_wall_s": 0.02}}


def _kill_and_resume(checkpoint: int, **kw):
    """The whole run's decisions after its checkpoint of step ``checkpoint``, the resumed run's, and the state."""
    whole = make(**kw)
    assert whole.run().status == "finished"
    history = whole.controller.history
    (cp,) = [c for c in whole.of(C.StartDuty) if c.kind == "checkpoint" and c.step == checkpoint]
    i = next(i for i, (_, _, c) in enumerate(history) if c is cp)
    # the duties of the checkpoint's step that came after it: the resumed run starts them with its workers
    after = [(t, s, c) for t, s, c in history[i + 1:] if not (isinstance(c, C.StartDuty) and s == checkpoint)]
    saved = json.loads(cp.state)
    resumed = make(start_step=checkpoint, saved=saved, **kw)
    started = len(resumed.controller.history)
    assert resumed.run().status == "finished"
    return after, resumed.controller.history[started:], saved


def _renamed(value, names: dict[int, int]):
    """``value`` with the PS keys (negative ints) in ``names`` renamed, in every field of a command, and its times to
    float rounding (a time is a sum of step times or wall seconds, added up in other pieces by the resumed run)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, int):
        return names.get(value, value)
    if isinstance(value, tuple):
        return tuple(_renamed(v, names) for v in value)
    if isinstance(value, C.Command):
        fields = {f.name: _renamed(getattr(value, f.name), names) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    return value


def _assert_same_decisions(whole, resumed, names: dict[int, int] | None = None) -> None:
    assert [(s, _renamed(c, names or {})) for _, s, c in whole] == [(s, _renamed(c, {})) for _, s, c in resumed]
    assert [t for t, _, _ in resumed] == pytest.approx([t for t, _, _ in whole], rel=1e-12)


@pytest.mark.parametrize(("spares", "checkpoint"), [(0, 150), (0, 250), (2, 100), (2, 300)])
def test_a_resumed_run_revokes_and_replaces_as_the_run_that_never_stopped(spares, checkpoint):
    """Workers on transient servers with drawn lifetimes, replacements that take 6 cloud seconds to start, with and
    without warm spares. Without the fleet in the saved state the resumed run drew new lifetimes from the start of
    the seeded stream and started cloud time at 0: its revocations fell elsewhere.

    A spare's process starts within two steps here: whether a spare is warm when it is taken is a wall-clock matter
    (its real process is up), the one thing a resumed run cannot replay."""
    whole, resumed, saved = _kill_and_resume(checkpoint, revocations=LIFETIMES, warm_spares=spares, **RUN)
    kinds = {type(c) for _, _, c in whole}
    assert {C.Revoke, C.LoseWorker, C.StartWorker, C.Joined, C.StartDuty} <= kinds  # the run goes on eventfully
    _assert_same_decisions(whole, resumed)
    fleet = saved["fleet"]
    assert fleet["step"] == checkpoint and len(fleet["spares"]["spares"]) == spares
    if not spares:  # a replacement was on its way at the checkpoint: the resumed run asks for it again
        assert len(fleet["workers"]["waiting"]) == 1


def test_a_resumed_run_notices_its_spot_parameter_servers_as_the_run_that_never_stopped():
    """Spot PS servers too: their ready times and drawn lifetimes are saved with the checkpoint, and the resumed run
    notices and evacuates them at the same steps. The shards a run starts are keyed -1, -2, ... in shard order, so
    the resumed run's names for the saved servers are those (``keys``); every key asked for later is the same."""
    whole, resumed, saved = _kill_and_resume(100, revocations=LIFETIMES + ",seed=4", warm_spares=1, ps=2,
                                             ps_transient=True, **RUN)
    assert any(isinstance(c, C.PsNoticed) for _, _, c in whole)
    names = {key: -1 - i for i, key in enumerate(saved["fleet"]["topology"]["keys"])}
    assert names != {-1: -1, -2: -2}  # a PS server had been replaced before the checkpoint
    _assert_same_decisions(whole, resumed, names)


def test_a_real_cluster_saves_no_fleet():
    """On a real cluster the servers of a resumed run are new ones: only the run's own state is saved."""
    d = make(steps=100, checkpoint_every=50, emulated=False, driver_kw={"real_time": True})
    assert d.run().status == "finished"
    (cp, *_) = [c for c in d.of(C.StartDuty) if c.kind == "checkpoint"]
    assert set(json.loads(cp.state)) == {"rollbacks", "lr_damping", "duties"}


def test_a_run_resumed_with_other_workers_starts_a_new_fleet_and_says_so():
    """``--resume`` with another ``--workers``: the saved fleet is not the run's; a new one starts, with a note."""
    whole = make(revocations=LIFETIMES, **RUN)
    assert whole.run().status == "finished"
    (cp,) = [c for c in whole.of(C.StartDuty) if c.kind == "checkpoint" and c.step == 200]
    resumed = make(start_step=200, saved=json.loads(cp.state), revocations=LIFETIMES, **{**RUN, "workers": 3})
    first = [c for _, _, c in resumed.controller.history]
    assert [c.kind for c in first if isinstance(c, C.Note)] == ["new_fleet"]
    assert [c.worker_id for c in first if isinstance(c, C.StartWorker)] == [0, 1, 2]
    assert resumed.run().status == "finished"


@pytest.mark.parametrize("edit", [
    lambda f: f.pop("workers"),
    lambda f: f.update(cloud_time="soon"),
    lambda f: f["workers"]["membership"].clear(),
    lambda f: f["workers"].update(waiting=[{"worker_id": 9}]),
    lambda f: f.update(wave=None),
])
def test_a_saved_fleet_that_does_not_read_starts_a_new_fleet_and_says_why(edit):
    """An edited or foreign checkpoint: its fleet is tried on a copy of the controller first, so nothing is left
    half-restored; the resumed run starts a new emulated fleet with a note naming what did not read."""
    whole = make(revocations=LIFETIMES, **RUN)
    assert whole.run().status == "finished"
    (cp,) = [c for c in whole.of(C.StartDuty) if c.kind == "checkpoint" and c.step == 200]
    saved = json.loads(cp.state)
    edit(saved["fleet"])
    resumed = make(start_step=200, saved=saved, revocations=LIFETIMES, **RUN)
    first = [c for _, _, c in resumed.controller.history]
    (note,) = [c for c in first if isinstance(c, C.Note)]
    assert note.kind == "new_fleet" and note.details["step"] == 200 and note.details["reason"]
    assert [c.worker_id for c in first if isinstance(c, C.StartWorker)] == [0, 1, 2, 3]
    assert resumed.run().status == "finished"
