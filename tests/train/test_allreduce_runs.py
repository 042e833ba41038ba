"""``cmdare train --topology allreduce`` (issue 44): a whole run on Ray, decided by the controller's all-reduce
topology and carried out by the all-reduce driver; its checkpoints in cmdare's format (any optimizer's state, the
data position), resumed bit for bit; the options that mean nothing there refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cli_inprocess import run_cmdare
from cmdare.collective import Rendezvous
from cmdare.events import TrainCallback
from cmdare.ps.optimizer_config import OptimizerConfig
from cmdare.ps.torch_optimizer import build_optimizer
from cmdare.train.allreduce.optimizer_state import load_optimizer_arrays, optimizer_arrays
from cmdare.train.allreduce.replica import Replica
from cmdare.train.duties.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from cmdare.train.spec import TrainSpec
from cmdare.train.trainer import Trainer


def _spec(**kw) -> TrainSpec:
    base = dict(model="resnet8", dataset="digits", workers=2, steps=200, batch_size=16, topology="allreduce",
                optimizer=OptimizerConfig(lr=0.05), checkpoint_every=50, eval_every=100, seed=3, transient=True,
                revocations="none", replace="same", startup="0", chunk_steps=5)
    base.update(kw)
    return TrainSpec(**base)


class _Log(TrainCallback):
    def __init__(self):
        self.events, self.end = [], None

    def on_event(self, r):
        self.events.append(r)

    def on_run_end(self, s):
        self.end = s

    def of(self, kind):
        return [e.details for e in self.events if e.kind == kind]


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_an_optimizers_state_goes_through_a_checkpoint_unchanged(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    params = list(model.parameters())
    opt = build_optimizer(name, params, OptimizerConfig(lr=0.1, momentum=0.9))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 5)).pow(2).mean().backward()
        opt.step()
    momentum, others = optimizer_arrays(opt, params)
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    ckpt = decode_checkpoint(encode_checkpoint(Checkpoint(3, flat, momentum, {}, {}, others)))
    fresh = build_optimizer(name, params, OptimizerConfig(lr=0.1, momentum=0.9))
    load_optimizer_arrays(fresh, params, ckpt.momentum, ckpt.optimizer)
    for p in params:
        assert set(fresh.state[p]) == set(opt.state[p])
        for key, value in opt.state[p].items():
            assert torch.equal(torch.as_tensor(fresh.state[p][key]), torch.as_tensor(value)), (name, key)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_a_member_resumed_from_its_checkpoint_trains_on_bit_identically(name):
    """A resume changes no value: the state a checkpoint holds (parameters, buffers, the optimizer's state, the
    step, the data position), stored and loaded, trains on exactly as the member that wrote it (exact equality)."""
    spec = _spec(optimizer_name=name)
    rendezvous = Rendezvous()
    try:
        first = Replica(spec, rendezvous.address, name)
        first.form(1, 0, 1)
        first.run_steps(7)
        state = first.checkpoint()
        ckpt = decode_checkpoint(encode_checkpoint(Checkpoint(
            state["step"], state["params"], state["momentum"], state["buffers"],
            {"data_position": state["where"]}, state["optimizer"])))
        second = Replica(spec, rendezvous.address, name)
        second.form(1, 0, 1)
        second.run_steps(3)  # a state of its own (parameters, optimizer state, step, data position) before the load
        second.restore({"step": ckpt.step, "params": ckpt.params, "momentum": ckpt.momentum,
                        "buffers": ckpt.buffers, "optimizer": ckpt.optimizer, "where": ckpt.meta["data_position"]})
        assert second.position() == first.position()
        a, b = first.run_steps(5), second.run_steps(5)
        assert a.loss == b.loss and a.step == b.step == 12
        assert np.array_equal(first.params(), second.params())
    finally:
        rendezvous.close()


def test_an_allreduce_run_regroups_on_its_members_state_and_resumes_from_its_checkpoint(local_ray, tmp_path):
    """Emulated revocations (every 1 s of emulated cloud time, a step 0.01 s: by step, not by the wall clock): a
    lost member costs a regroup from the survivor's state, never a checkpoint while one lives; the run finishes,
    and its checkpoint resumes it with the group's AdamW state."""
    log = _Log()
    spec = _spec(revocations="every=1,step=0.01", optimizer_name="adamw", optimizer=OptimizerConfig(lr=0.002))
    summary = Trainer(spec, [log], checkpoint_dir=tmp_path, run_id="ar-run").run()
    assert summary.status == "finished" and summary.global_step == 200
    assert summary.revocations >= 1 and summary.replacements >= 1
    regroups = log.of("regroup")
    assert regroups[0]["why"].startswith("the first group") and len(regroups[0]["members"]) == 2
    losses = [r for r in regroups if r["why"].startswith("the group changed") and "left" in r["why"]]
    assert losses, regroups
    for r in losses:  # a survivor held the state: nothing loaded from storage
        assert not r["from_checkpoint"] and r["root"] in r["members"], r
    for r in regroups:  # storage only when no member of the group was left (the next loss before a newcomer was up)
        assert not r["from_checkpoint"] or "no member of the last group is left" in r["why"], r
    assert summary.final_accuracy is not None and summary.final_accuracy > 0.5
    log2 = _Log()
    resumed = Trainer(_spec(steps=260, optimizer_name="adamw", optimizer=OptimizerConfig(lr=0.002)), [log2],
                      checkpoint_dir=tmp_path, run_id="ar-run", resume=True).run()
    assert resumed.status == "finished" and resumed.global_step == 260
    first = log2.of("regroup")[0]
    assert first["from_checkpoint"] and first["step"] == 200, first


def test_a_warm_spare_member_replaces_a_lost_one_and_is_healed_into_the_group(local_ray, tmp_path):
    log = _Log()
    spec = _spec(revocations="trace=60@1,step=1", warm_spares=1, steps=150, eval_every=0, startup="30")
    summary = Trainer(spec, [log], checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == 150 and summary.replacements == 1
    (requested,) = log.of("replacement_requested")
    assert requested["warm"] is True, requested  # the standby member, not a cold start of 30 emulated seconds
    joined = [r for r in log.of("regroup") if "joined" in r["why"]]
    assert joined and not joined[0]["from_checkpoint"] and len(joined[0]["members"]) == 2, log.of("regroup")


def test_an_amp_fp16_group_with_clipping_trains_through_a_loss(local_ray, tmp_path):
    """``--precision amp-fp16 --clip-grad-norm 1`` (the gradient unscaled before its norm is taken): a member lost
    at step 60, the survivor goes on alone and its replacement heals from it, scale included; the group learns."""
    class Losses(_Log):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_step(self, r):
            self.losses.append(r.loss)

    log = Losses()
    spec = _spec(precision="amp-fp16", clip_grad_norm=1.0, revocations="trace=60@1,step=1", steps=150,
                 eval_every=0)
    summary = Trainer(spec, [log], checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == 150 and summary.revocations == 1
    assert not any(r["from_checkpoint"] for r in log.of("regroup")), log.of("regroup")
    losses = [v for v in log.losses if v is not None]
    assert all(np.isfinite(losses)) and np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])


def test_an_amp_fp16_member_whose_gradient_overflows_at_the_smallest_scale_reports_divergence():
    """Non-finite parameters make every gradient non-finite: the scale halves to 1, then the member stops and
    says at which step it diverged (the run's ``--on-diverge`` acts on it), its loss not a number."""
    rendezvous = Rendezvous()
    try:
        member = Replica(_spec(precision="amp-fp16"), rendezvous.address)
        member.form(1, 0, 1)
        assert member.run_steps(3).step == 3
        with torch.no_grad():
            next(member.model.parameters()).fill_(float("nan"))
        chunk = member.run_steps(5)
        assert (chunk.steps, chunk.step, chunk.diverged_at) == (0, 3, 3)
        assert chunk.overflow_skips == 17 and chunk.loss_scale == 1.0 and np.isnan(chunk.loss)
    finally:
        rendezvous.close()


def test_a_noticed_member_leaves_at_a_round_boundary_and_nothing_is_lost(local_ray, tmp_path):
    """A member's server gets a preemption notice (GCE's metadata endpoint, emulated on 127.0.0.1): the member trains
    to the end of its round and says so; the group stops there, the chief checkpoints, leaves, and the group is
    re-formed without it from the survivor's state, then with its replacement: no collective fails, no step is
    lost, nothing is loaded from storage. (Whether the replacement's process is up before the run's end is the
    machine's pace: its join is checked where it happens.)"""
    from cmdare.cloud.local import LocalProcessProvider
    from cmdare.cloud.notices import LocalMetadataServer

    class _Preempt(_Log):
        def on_step(self, r):
            if r.global_step >= 60 and not meta.preempted:
                meta.preempt()

    with LocalMetadataServer() as meta:
        provider = LocalProcessProvider()
        provider.notices = {0: (meta.gce_url, "gce")}  # the first member's server (the chief) watches it
        log = _Preempt()
        summary = Trainer(_spec(eval_every=0, checkpoint_every=100), [log], checkpoint_dir=tmp_path,
                          provider=provider).run()
    assert summary.status == "finished" and summary.global_step == 200
    (notice,) = log.of("notice")
    assert notice["provider"] == "gce" and notice["chief"] is True
    assert not log.of("collective_failed") and not log.of("worker_lost"), log.of("collective_failed")
    ended = [d for d in log.of("server_ended") if d.get("reason") == "notice"]
    assert len(ended) == 1 and summary.revocations == 1 and summary.replacements == 1
    groups = [(tuple(r["members"]), r["from_checkpoint"]) for r in log.of("regroup")]
    assert groups[:2] == [((0, 1), False), ((1,), False)], groups
    assert all(g == ((1, 2), False) for g in groups[2:]), groups  # the replacement, if up before the end: healed
    assert log.of("replacement_requested")
    assert log.of("chief_change")[0] == {"from": 0, "to": 1}


@pytest.mark.parametrize(("args", "says"), [
    (["--topology", "allreduce", "--placement", "psld"], "--topology allreduce has no parameter servers: --placement"),
    (["--topology", "allreduce", "--ps", "2"], "--topology allreduce has no parameter servers: --ps"),
    (["--topology", "allreduce", "--ps-transient"], "--ps-transient means nothing there"),
    (["--topology", "allreduce", "--sync"], "an all-reduce run is synchronous already"),
    (["--precision", "amp-fp16", "--clip-grad-norm", "1"], "--clip-grad-norm with --precision amp-fp16 is not built "
                                                           "for a PS run"),
    (["--optimizer", "torch.optim:LBFGS"], "--optimizer torch.optim:LBFGS cannot step on a parameter shard's block"),
    (["--topology", "allreduce", "--optimizer", "json:JSONDecoder"], "not a torch.optim.Optimizer class"),
    (["--topology", "ring"], "--topology"),
    (["--topology", "allreduce", "--optimizer", "lion"], "--optimizer must be sgd, adamw"),
    (["--lr-schedule", "linear"], "--lr-schedule must be constant or cosine"),
    (["--clip-grad-norm", "0"], "--clip-grad-norm must be a positive number"),
])
def test_options_that_mean_nothing_in_the_topology_are_refused_in_one_line(tmp_path, args, says):
    code, out, err = run_cmdare(tmp_path, "train", "--steps", "10", "--no-record", *args)
    assert code != 0 and says in err, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_resumed_run_keeps_its_topology_optimizer_and_schedule_and_takes_what_is_given(tmp_path):
    from cmdare.storage import Storage
    from cmdare.train.cli.resume import resumed_spec
    from cmdare.train.runtime.run_files import write_run_spec

    run = Storage(tmp_path / "run")
    cosine = OptimizerConfig(lr=0.01, schedule="cosine", warmup_steps=5, total_steps=200)
    write_run_spec(run, "r", _spec(optimizer_name="adamw", optimizer=cosine, clip_grad_norm=1.0).to_dict())
    given = TrainSpec(steps=400, optimizer=OptimizerConfig(lr=0.5))  # the command line's defaults but --steps
    spec = resumed_spec(run, given, {"steps"}, joined=False)
    assert (spec.topology, spec.optimizer_name, spec.clip_grad_norm) == ("allreduce", "adamw", 1.0)
    assert (spec.optimizer.lr, spec.optimizer.schedule, spec.optimizer.warmup_steps) == (0.01, "cosine", 5)
    assert spec.optimizer.total_steps == 400  # the cosine decays over the run's new length
    lr = TrainSpec(optimizer=OptimizerConfig(lr=0.02))
    assert resumed_spec(run, lr, {"lr"}, joined=False).optimizer.total_steps == 200
    sgd = resumed_spec(run, TrainSpec(topology="allreduce", optimizer_name="sgd"), {"optimizer"}, joined=False)
    assert sgd.optimizer_name == "sgd" and sgd.optimizer.lr == 0.01
