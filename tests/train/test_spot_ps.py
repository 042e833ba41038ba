"""Parameter servers on spot servers: a shard's blocks leave within its notice, and nothing changes value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_ps_equivalence import OPT  # noqa: E402

from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.checkpoint import latest_checkpoint, load_checkpoint


class _Events(TrainCallback):
    def __init__(self):
        self.events = []

    def on_event(self, r):
        self.events.append(r)

    def kinds(self, kind):
        return [e for e in self.events if e.kind == kind]


def _spec(**kw):
    # schedules in emulated seconds of 0.01 s steps (step=0.01 in the revocations): a synchronous round is one
    # step of 0.01 s, an asynchronous pair of workers makes 200 steps a second; a replacement PS is ready at once
    # (startup 0), so what waits for it is its real start
    base = dict(model="resnet8", dataset="digits", workers=2, ps=2, steps=80, batch_size=16, sync=True,
                optimizer=OPT, checkpoint_every=80, eval_every=0, seed=3, chunk_steps=5, startup="0")
    base.update(kw)
    return TrainSpec(**base)


def _params(path) -> np.ndarray:
    return load_checkpoint(latest_checkpoint(path)).params


def test_sync_run_with_ps_evacuations_equals_the_fault_free_run(local_ray, tmp_path):
    # 300 rounds, 3 emulated seconds: notices at 0.3, 1.3 and 2.3 s (rounds 30, 130, 230), long before their deadline
    plain = Trainer(_spec(steps=300, checkpoint_every=300), checkpoint_dir=tmp_path / "plain").run()
    log = _Events()
    spot = _spec(steps=300, checkpoint_every=300, ps_transient=True,
                 revocations="every=1,first=0.3,notice=300,hit=ps,step=0.01")
    summary = Trainer(spot, [log], checkpoint_dir=tmp_path / "spot").run()
    assert plain.global_step == summary.global_step == 300 and summary.status == "finished"
    evacuated = log.kinds("shard_evacuated")
    assert len(evacuated) >= 1 and summary.details["shards_evacuated"] == len(evacuated)
    assert not log.kinds("shard_restored") and summary.details["steps_lost"] == 0
    notices = log.kinds("ps_notice")
    assert len(notices) >= len(evacuated) and summary.revocations == len(notices)
    for e in evacuated:  # blocks moved and the server released before the deadline
        assert e.details["moved_bytes"] > 0 and e.details["margin_s"] > 0 and e.details["pause_s"] > 0
    ended = {e.server_id: e.details["reason"] for e in log.kinds("server_ended")}
    assert sum(r == "evacuated" for r in ended.values()) == len(evacuated)
    np.testing.assert_array_equal(_params(tmp_path / "spot"), _params(tmp_path / "plain"))


@pytest.mark.cluster  # make test-cluster: two more runs
def test_psld_plans_the_evacuations_the_controller_commands_and_no_value_changes(local_ray, tmp_path):
    """With --placement psld the controller asks PSLD where a noticed shard's blocks go and what its replacement
    takes; the driver carries out exactly those moves: the result equals the fault-free run's."""
    plain = Trainer(_spec(steps=300, checkpoint_every=300, placement="psld"), checkpoint_dir=tmp_path / "plain").run()
    log = _Events()
    spot = _spec(steps=300, checkpoint_every=300, ps_transient=True, placement="psld",
                 revocations="every=1,first=0.3,notice=300,hit=ps,step=0.01")
    summary = Trainer(spot, [log], checkpoint_dir=tmp_path / "spot").run()
    assert summary.status == "finished" and plain.global_step == summary.global_step == 300
    onto = [e.details["onto"] for e in log.kinds("shard_evacuated")]
    assert "survivors" in onto and not log.kinds("shard_restored")  # PSLD's drain plan carried out
    np.testing.assert_array_equal(_params(tmp_path / "spot"), _params(tmp_path / "plain"))


@pytest.mark.cluster  # make test-cluster: a long run with PS notices
def test_the_last_shard_moves_to_its_replacement_within_the_notice(local_ray, tmp_path):
    plain = Trainer(_spec(ps=1, steps=300, checkpoint_every=300), checkpoint_dir=tmp_path / "plain").run()
    log = _Events()
    spot = _spec(ps=1, steps=300, checkpoint_every=300, ps_transient=True,
                 revocations="every=60,first=0.5,notice=300,hit=ps,step=0.01")
    summary = Trainer(spot, [log], checkpoint_dir=tmp_path / "spot").run()
    assert summary.status == "finished" and summary.global_step == plain.global_step == 300
    (evac,) = log.kinds("shard_evacuated")
    assert evac.details["onto"] == "replacement" and evac.details["num_shards"] == 1
    assert not log.kinds("shard_restored")
    np.testing.assert_array_equal(_params(tmp_path / "spot"), _params(tmp_path / "plain"))


@pytest.mark.cluster  # make test-cluster: a long run with PS notices
def test_a_short_notice_parks_the_last_shards_blocks_until_its_replacement_is_up(local_ray, tmp_path):
    # the notice at round 50, its deadline 1 emulated second later: the replacement's start-up is 60 s (startup),
    # so at half the notice (round 100) the last shard parks until the replacement is up
    plain = Trainer(_spec(ps=1, steps=300, checkpoint_every=300), checkpoint_dir=tmp_path / "plain").run()
    log = _Events()
    spot = _spec(ps=1, steps=300, checkpoint_every=300, ps_transient=True, startup="60",
                 revocations="every=4,first=0.5,notice=1,hit=ps,step=0.01")
    summary = Trainer(spot, [log], checkpoint_dir=tmp_path / "spot").run()
    assert summary.status == "finished" and summary.global_step == plain.global_step == 300
    parked = log.kinds("shard_parked")
    evacuated = log.kinds("shard_evacuated")
    assert parked and all(e.details["margin_s"] > 0 for e in parked)  # taken before the deadline
    assert len(evacuated) == len(parked) and all(e.details["parked"] for e in evacuated)
    assert not log.kinds("shard_restored") and summary.details["steps_lost"] == 0
    np.testing.assert_array_equal(_params(tmp_path / "spot"), _params(tmp_path / "plain"))


def test_without_notice_the_shards_roll_back_and_the_lost_steps_are_reported(local_ray, tmp_path):
    log = _Events()
    # asynchronous, 200 steps an emulated second: the PS server is revoked without notice at step 60, then at 460
    spec = _spec(sync=False, steps=400, checkpoint_every=20, ps_transient=True,
                 revocations="every=2,first=0.3,notice=0,hit=ps,step=0.01")
    summary = Trainer(spec, [log], checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == 400
    killed = log.kinds("ps_revocation")
    restored = log.kinds("shard_restored")
    assert killed and all(not e.details["noticed"] for e in killed) and restored
    assert not log.kinds("shard_evacuated")
    assert summary.details["steps_lost"] == sum(e.details["steps_lost"] for e in restored)
    # a checkpoint every 20 steps, taken at its step: a loss without notice costs less than 20 steps
    assert all(e.details["steps_lost"] < 20 for e in restored)


def _run_or_dump_stacks(cmd: list[str], env: dict, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd``; past ``timeout_s``, fail with its output and every driver thread's stack (``kill -USR1``)."""
    import signal

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"no end after {timeout_s} s; output: {out[-1500:]}\nstderr and stacks: {err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.cluster  # make test-cluster: a long CLI run with PS notices
def test_cli_summary_reports_evacuations_and_no_lost_steps(tmp_path):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    cmd = [str(Path(sys.executable).parent / "cmdare"), "train", "--model", "resnet8", "--sync", "--workers", "2",
           "--ps", "2", "--ps-transient", "--revocations", "every=1,first=0.5,notice=0.2,hit=ps,step=0.01",
           "--startup", "0", "--steps", "300", "--no-record", "--tensorboard", "none"]
    res = _run_or_dump_stacks(cmd, env, timeout_s=300)
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r"(\d+) shards evacuated \((\d+) parked[^)]*\), (\d+) steps lost", res.stdout)
    assert m and int(m.group(1)) >= 1 and int(m.group(3)) == 0, res.stdout


@pytest.mark.cluster  # make test-cluster: a long CLI run and its simulation
def test_train_and_plan_simulate_park_the_last_shard_on_the_same_notice_trace(tmp_path):
    # one PS server, noticed at cloud second 2 with a 4 s lead: its replacement's start-up (the startup model's,
    # a minute or more) cannot make the deadline, so the last shard parks until it is up, in the trainer (emulated
    # time, 0.02 s a worker step) and in the simulator alike, and no step is lost
    trace = "trace=2@ps,notice=4"
    cmdare = str(Path(sys.executable).parent / "cmdare")
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), COLUMNS="200")
    train = subprocess.run([cmdare, "train", "--model", "resnet8", "--workers", "2", "--ps", "1", "--ps-transient",
                            "--revocations", f"{trace},step=0.02", "--steps", "600", "--no-record",
                            "--tensorboard", "none"], capture_output=True, text=True, env=env, timeout=300)
    assert train.returncode == 0, train.stderr[-2000:]
    plan = subprocess.run([cmdare, "plan", "simulate", "--model", "t2t_resnet32", "--workers", "k80:2", "--ps", "1",
                           "--ps-transient", "--revocations", trace, "--steps", "2000", "--runs", "3"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    t = re.search(r"(\d+) shards evacuated \((\d+) parked until their replacement was up\), (\d+) steps lost",
                  train.stdout)
    p = re.search(r"([\d.]+) shards evacuated \(([\d.]+) parked until their replacement was up\), (\d+) steps lost",
                  plan.stdout)
    assert t and p, (train.stdout, plan.stdout)
    assert (int(t.group(1)), int(t.group(2)), int(t.group(3))) == (1, 1, 0), train.stdout
    assert (float(p.group(1)), float(p.group(2)), int(p.group(3))) == (1.0, 1.0, 0), plan.stdout
    assert re.search(r"servers: 1 revoked, 1 replaced", train.stdout), train.stdout
    assert "revocations 1.00, replacements 1.00" in plan.stdout, plan.stdout
