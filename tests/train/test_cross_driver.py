"""One event script, two drivers: the Ray trainer (emulated, on a local multi-node cluster) and the SimPy
simulator drive the same run controller, and take the same decisions at the same cloud times.

The script: three K80 workers, each step 0.05 emulated seconds (``step=0.05``: 60 global steps per second
with three workers); slot 0 (the chief) revoked 2 s after the first step, slot 1 (the next chief) at 6 s; every
replacement ready 1.5 s after it is asked for. The simulator gets the same speeds (20 steps/s per worker) and
start-up, so cloud time means the same in both.
"""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.local import LocalClusterProvider, StartupDelay
from cmdare.control import TraceRevocations
from cmdare.control import run_commands as C
from cmdare.plan.replay import FixedStartup, FlatPrices, MeasuredSpeed, ScriptedLifetimes
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import ClusterSpec, JobSpec, PlanModels, WorkerGroup
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec

SCHEDULE = ((2.0, 0), (6.0, 1))
STARTUP_S = 1.5
STEP_S = 0.05
STEPS = 900  # 15 emulated seconds with three workers: the schedule falls well inside
DECISIONS = (C.Revoke, C.LoseWorker, C.StartWorker, C.SetChief, C.SetLrScale, C.EndRun)


def _decisions(history) -> list[tuple]:
    """The comparable part of a controller's history: each decision, its arguments and its cloud time."""
    out = []
    for now, _step, c in history:
        if isinstance(c, DECISIONS):
            fields = {k: v for k, v in c.__dict__.items() if k not in ("spec", "why", "state")}  # what is done, not why
            out.append((type(c).__name__, tuple(sorted(fields.items())), round(now, 6)))
    return out


def _simulated():
    job = JobSpec("toy", STEPS, checkpoint_every_steps=300, lr_policy="linear")
    cluster = ClusterSpec((WorkerGroup("K80", 3, True, "us-east1"),), ps=1, region="us-east1", replacement="same")
    models = PlanModels(speed=MeasuredSpeed({"K80": 1 / STEP_S}), lifetimes=ScriptedLifetimes(),
                        startup=FixedStartup(STARTUP_S), prices=FlatPrices({"K80": 0.45, "cpu": 0.05}),
                        checkpoint_s=0.0, source="cross-driver")
    sim = Simulator(job, cluster, models, revocations=lambda: TraceRevocations(SCHEDULE))
    run = sim._run(np.random.default_rng(0))
    result = run.result()
    assert result.finished and result.revocations == 2 and result.replacements == 2
    return run.controller


@pytest.mark.cluster  # make test-cluster: a multi-node cluster against the simulator
def test_trainer_and_simulator_take_the_same_decisions_at_the_same_cloud_times(cluster, tmp_path):
    trace = "+".join(f"{t}@{slot}" for t, slot in SCHEDULE)
    spec = TrainSpec(model="resnet8", dataset="digits", workers=3, ps=1, steps=STEPS, batch_size=16,
                     optimizer=OptimizerConfig(lr=0.02), checkpoint_every=300, eval_every=0, seed=3, transient=True,
                     revocations=f"trace={trace},step={STEP_S}", replace="same", lr_policy="linear",
                     startup=str(STARTUP_S), chunk_steps=5, gpu="k80")
    provider = LocalClusterProvider(cluster, StartupDelay(str(STARTUP_S)))
    trainer = Trainer(spec, checkpoint_dir=tmp_path, provider=provider)
    summary = trainer.run()
    assert summary.status == "finished" and summary.revocations == 2 and summary.replacements == 2
    simulated = _simulated()
    real, sim = _decisions(trainer.controller.history), _decisions(simulated.history)
    assert real == sim, "\n".join(f"{a}  |  {b}" for a, b in zip(real, sim, strict=False))
    # the same membership timeline too: the chief handed from 0 to 1, then (slot 1 lost) to 2, never to a newcomer
    assert [e.key() for e in trainer.kernel.timeline] == [e.key() for e in simulated.kernel.timeline]
    chiefs = [c.worker_id for _t, _s, c in trainer.controller.history if isinstance(c, C.SetChief)]
    assert chiefs == [0, 1, 2]
    # the revocations fell at the steps the script names (2 s = step 120; 6 s after 2 s of 3 workers, 1.5 s of 2
    # and 2.5 s of 3 again: 120 + 60 + 150 = 330)
    assert [step for _t, step, c in trainer.controller.history if isinstance(c, C.Revoke)] == [120, 330]
    # checkpoints at the steps the schedule names, the last at the end
    ckpts = [c.step for _t, _s, c in trainer.controller.history
             if isinstance(c, C.StartDuty) and c.kind == "checkpoint"]
    assert ckpts == [300, 600, 900]


@pytest.mark.parametrize("text", ["step=0", "step=-1", "step=x"])
def test_bad_emulated_step_times_are_refused(text):
    from cmdare.control import RevocationPlan
    from cmdare.errors import UserInputError

    with pytest.raises(UserInputError, match="step"):
        RevocationPlan.parse(f"trace=1@0,{text}")
