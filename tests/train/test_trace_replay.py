"""One revocation trace, two drivers: ``cmdare train`` (local emulation, time compressed by ``speedup``) and
``cmdare plan simulate`` revoke at the same trace times, as often."""

from __future__ import annotations

import json
import sys

import pytest

from cmdare import cli
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec

SPEEDUP = 100.0  # 100 trace seconds per emulated second
# a worker at 4 s and the (lowest live) K80 at 10 s of emulated time (every worker step is 0.05 emulated
# seconds, two workers); the notice and the capacity's return are recorded data replay does not act on
TRACE = "time_s,server,event\n400,*,revoke\n970,k80,notice\n1000,k80,revoke\n1500,*,available\n"


def _simulated(monkeypatch, capsys, trace: str) -> dict:
    monkeypatch.setattr(sys, "argv", ["cmdare", "plan", "simulate", "--model", "t2t_resnet32", "--steps", "640000",
                                      "--workers", "k80:2", "--transient", "--runs", "3", "--trace", trace, "--json"])
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    return json.loads(capsys.readouterr().out)


@pytest.mark.cluster  # make test-cluster: a trace through a real run and the simulator
def test_one_trace_through_train_and_plan_simulate(local_ray, tmp_path, monkeypatch, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=600, batch_size=16,
                     optimizer=OptimizerConfig(lr=0.02), checkpoint_every=0, eval_every=0, seed=1, transient=True,
                     revocations=f"trace={trace},speedup={SPEEDUP:g},step=0.05", replace="same", startup="0.5",
                     chunk_steps=5, gpu="k80")
    trainer = Trainer(spec, checkpoint_dir=tmp_path)
    summary = trainer.run()
    assert summary.status == "finished" and summary.revocations == 2 and summary.replacements == 2
    # the kernel's timeline is in emulated cloud seconds from the first step: trace seconds over the speedup
    real = [e.time * SPEEDUP for e in trainer.kernel.timeline if e.kind == "loss"]
    simulated = _simulated(monkeypatch, capsys, str(trace))
    assert simulated["revocations_mean"] == 2 and simulated["revocation_times_s"] == [400.0, 1000.0]
    assert real == pytest.approx(simulated["revocation_times_s"], abs=1e-6)
    # at steps 160 (4 s) and 399: the replacement joined at the first whole step after its server was ready
    # (step 161, 4.05 s), so 10 s fell 5.95 s of two workers later
    steps = [step for _t, step, c in trainer.controller.history if type(c).__name__ == "Revoke"]
    assert steps == [160, 399]
