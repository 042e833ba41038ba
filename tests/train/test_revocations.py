"""Revocations on one Ray node: chief loss moves the chief's duties; a notice loses no step."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.local import LocalProcessProvider
from cmdare.cloud.notices import LocalMetadataServer
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _Log(TrainCallback):
    def __init__(self, on_step=None):
        self.steps, self.events, self.ckpts, self.end = [], [], [], None
        self._hook = on_step

    def on_step(self, r):
        self.steps.append(r)
        if self._hook:
            self._hook(r)

    def on_event(self, r):
        self.events.append(r)

    def on_checkpoint(self, r):
        self.ckpts.append(r)

    def on_run_end(self, s):
        self.end = s

    def kinds(self, kind):
        return [e for e in self.events if e.kind == kind]


def _spec(**kw):
    base = dict(model="resnet8", dataset="digits", workers=3, ps=1, steps=240, batch_size=32,
                optimizer=OptimizerConfig(lr=0.05), checkpoint_every=40, eval_every=0, seed=2, transient=True,
                revocations="none", replace="same", startup="0", chunk_steps=5)
    base.update(kw)
    return TrainSpec(**base)


def test_chief_revocation_moves_checkpointing_without_restart(local_ray, tmp_path):
    state = {}

    def revoke_chief(r):
        if r.global_step >= 80 and "done" not in state:
            state["done"] = trainer.chief.worker_id
            trainer.chief.revoked_at = state["revoked_at"] = __import__("time").time()
            trainer.emitter.event("revocation", worker_id=state["done"], details={"source": "test"})
            trainer.provider.revoke(trainer.chief.server)  # kills the chief's process

    log = _Log(revoke_chief)
    # emulated time: every step 1 s; a replacement's server is ready 5 s after it is asked for
    trainer = Trainer(_spec(revocations="step=1", startup="5"), [log], checkpoint_dir=tmp_path)
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 240
    old = state["done"]
    change = log.kinds("chief_change")[0]
    assert change.details["from"] == old and change.details["to"] not in (None, old)
    # checkpoints continue, written by the new chief, at increasing steps; training was not restarted
    after = [c for c in log.ckpts if c.time > change.time]
    assert after and all(c.worker_id == change.details["to"] for c in after)
    steps = [c.global_step for c in log.ckpts]
    assert steps == sorted(steps) and steps[-1] == 240
    reported = np.cumsum([r.steps for r in log.steps])  # chunks reported once (the revoked chief's last: never)
    assert all(n <= r.global_step for n, r in zip(reported, log.steps, strict=True)), list(reported)
    lost = log.kinds("worker_lost")[0]
    # the delay runs from the revocation to the loss being handled (just before its event)
    since = lost.time - state["revoked_at"]
    assert lost.worker_id == old and since - 0.5 <= lost.details["detection_delay_s"] <= since
    joined = log.kinds("replacement_joined")
    assert joined and joined[0].details["recovery_s"] == 5.0 and summary.replacements == 1  # emulated seconds


def test_notice_checkpoints_leaves_and_loses_no_step(local_ray, tmp_path):
    with LocalMetadataServer() as meta:
        provider = LocalProcessProvider()
        provider.notices = {0: (meta.gce_url, "gce")}  # the first worker's server (the chief) watches it

        def preempt(r):
            if r.global_step >= 60 and not meta.preempted:
                meta.preempt()

        log = _Log(preempt)
        summary = Trainer(_spec(workers=2, steps=200, checkpoint_every=100), [log], checkpoint_dir=tmp_path,
                          provider=provider).run()
    assert summary.status == "finished" and summary.global_step == 200
    notice = log.kinds("notice")[0]
    assert notice.worker_id == 0 and notice.details["chief"] is True
    # the chief checkpointed on the notice (between the periodic ones), then handed the role over: its
    # last checkpoint is the notice's (a periodic one may be taken a few steps after its multiple of 100)
    mine = [c.global_step for c in log.ckpts if c.worker_id == 0]
    assert mine and notice.global_step <= max(mine) < 200
    assert log.kinds("chief_change")[0].details == {"from": 0, "to": 1}
    ended = [e for e in log.kinds("server_ended") if e.details.get("reason") == "notice"]
    assert len(ended) == 1
    # no step lost: every applied push was reported by a finished chunk
    assert sum(r.steps for r in log.steps) == 200
    assert log.kinds("replacement_joined") and summary.revocations == 1


def test_an_aws_rebalance_recommendation_is_reported_and_the_worker_trains_on_until_its_notice(local_ray, tmp_path):
    with LocalMetadataServer() as meta:
        provider = LocalProcessProvider()
        provider.notices = {1: (meta.aws_url, "aws")}  # the second worker's server watches EC2's endpoints

        def signal(r):
            if r.global_step >= 40 and meta.rebalance_at is None:
                meta.recommend_rebalance()
            risk = [e for e in log.events if e.kind == "rebalance_recommendation"]
            after = sum(x.steps for x in log.steps if x.worker_id == 1 and risk and x.time > risk[0].time)
            if after >= 20 and not meta.preempted:  # it trained on after the recommendation: now the notice
                meta.preempt()

        log = _Log(signal)
        summary = Trainer(_spec(workers=2, steps=400, checkpoint_every=0), [log], checkpoint_dir=tmp_path,
                          provider=provider).run()
    assert summary.status == "finished" and summary.global_step == 400
    (risk,) = log.kinds("rebalance_recommendation")  # reported once
    assert risk.worker_id == 1 and risk.details["provider"] == "aws" and risk.details["action"] == "rebalance"
    (notice,) = log.kinds("notice")
    assert notice.worker_id == 1 and notice.time > risk.time
    trained_between = sum(x.steps for x in log.steps if x.worker_id == 1 and risk.time < x.time <= notice.time)
    assert trained_between >= 20
    assert log.kinds("replacement_joined") and summary.revocations == 1


@pytest.mark.parametrize("text", ["lifetime", "every=-1", "speedup=2,every=3,lifetime=bathtub", "foo=1"])
def test_bad_revocation_specs(text):
    from cmdare.control import RevocationPlan
    from cmdare.errors import UserInputError

    with pytest.raises(UserInputError):
        RevocationPlan.parse(text)
