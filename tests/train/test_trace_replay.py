"""One revocation trace, two drivers: ``cmdare train`` (local emulation, time compressed by ``speedup``) and
``cmdare plan simulate`` revoke at the same trace times (within the trainer's loop resolution) as often."""

from __future__ import annotations

import json
import sys

from cmdare import cli
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec

SPEEDUP = 100.0  # 100 trace seconds per emulated second
# a worker at 4 s and the (lowest live) K80 at 10 s of emulated time; the notice and the capacity's return
# are recorded data that replay does not act on
TRACE = "time_s,server,event\n400,*,revoke\n970,k80,notice\n1000,k80,revoke\n1500,*,available\n"
TOLERANCE_S = 1.0  # emulated seconds: the trainer looks at due revocations every 0.05 s, between chunk calls


def _simulated(monkeypatch, capsys, trace: str) -> dict:
    monkeypatch.setattr(sys, "argv", ["cmdare", "plan", "simulate", "--model", "resnet32", "--steps", "640000",
                                      "--workers", "k80:2", "--transient", "--runs", "3", "--trace", trace, "--json"])
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    return json.loads(capsys.readouterr().out)


def test_one_trace_through_train_and_plan_simulate(local_ray, tmp_path, monkeypatch, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    # an emulated 8 MB/s PS link paces training (a sleep per transfer), so 200 steps outlast the trace's 10 s
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=200, batch_size=16,
                     optimizer=OptimizerConfig(lr=0.02), checkpoint_every=0, eval_every=0, seed=1, transient=True,
                     revocations=f"trace={trace},speedup={SPEEDUP:g}", replace="same", startup="0.5",
                     chunk_steps=2, gpu="k80", ps_bandwidth="8MB/s")
    trainer = Trainer(spec, checkpoint_dir=tmp_path)
    summary = trainer.run()
    assert summary.status == "finished" and summary.revocations == 2 and summary.replacements == 2
    start = trainer.members.started_at
    real = [(e.time - start) * SPEEDUP for e in trainer.kernel.timeline if e.kind == "loss"]
    simulated = _simulated(monkeypatch, capsys, str(trace))
    assert simulated["revocations_mean"] == 2 and simulated["revocation_times_s"] == [400.0, 1000.0]
    assert len(real) == len(simulated["revocation_times_s"])
    for r, s in zip(real, simulated["revocation_times_s"], strict=True):
        assert s <= r <= s + TOLERANCE_S * SPEEDUP, (real, simulated["revocation_times_s"])
