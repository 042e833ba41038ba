"""One scripted revocation schedule, two drivers: the Ray trainer on a local multi-node cluster and the
SimPy simulator give the same membership timeline (joins, losses, chief changes, LR scale changes, replacement
requests) in the same order, because both execute the same control-kernel policies."""

from __future__ import annotations

import numpy as np

from cmdare.cloud.local import LocalClusterProvider
from cmdare.control import TraceRevocations
from cmdare.plan.replay import FixedStartup, FlatPrices, MeasuredSpeed, ScriptedLifetimes
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import ClusterSpec, JobSpec, PlanModels, WorkerGroup
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec

# slot 0 (the chief) at 2 s after the first step, slot 1 (the next chief) at 6 s; start-up fixed at 1.5 s
SCHEDULE = ((2.0, 0), (6.0, 1))
STARTUP_S = 1.5


def _simulated_timeline() -> list[tuple]:
    job = JobSpec("toy", 300, checkpoint_every_steps=100, lr_policy="linear")
    cluster = ClusterSpec((WorkerGroup("K80", 3, True, "us-east1"),), ps=1, region="us-east1", replacement="same")
    models = PlanModels(speed=MeasuredSpeed({"K80": 1.0}), lifetimes=ScriptedLifetimes(),
                        startup=FixedStartup(STARTUP_S), prices=FlatPrices({"K80": 0.45, "cpu": 0.05}),
                        checkpoint_s=0.0, source="cross-driver")
    sim = Simulator(job, cluster, models, revocations=lambda: TraceRevocations(SCHEDULE))
    result, timeline = sim.run_traced(np.random.default_rng(0))
    assert result.finished and result.revocations == 2 and result.replacements == 2
    return [e.key() for e in timeline]


def test_trainer_and_simulator_agree_on_the_membership_timeline(cluster, tmp_path):
    trace = "+".join(f"{t}@{slot}" for t, slot in SCHEDULE)
    # an emulated 8 MB/s PS link paces training at ~6 steps/s whatever the CPUs do (a sleep per transfer), so
    # 150 steps outlast the schedule (~12 s with detection, start-up and the replacements' first steps)
    spec = TrainSpec(model="resnet8", dataset="digits", workers=3, ps=1, steps=150, batch_size=16,
                     optimizer=OptimizerConfig(lr=0.02), checkpoint_every=0, eval_every=0, seed=3, transient=True,
                     revocations=f"trace={trace}", replace="same", lr_policy="linear", startup=str(STARTUP_S),
                     chunk_steps=2, gpu="k80", ps_bandwidth="8MB/s")
    trainer = Trainer(spec, checkpoint_dir=tmp_path, provider=LocalClusterProvider(cluster))
    summary = trainer.run()
    assert summary.status == "finished" and summary.revocations == 2 and summary.replacements == 2
    real = [e.key() for e in trainer.kernel.timeline]
    simulated = _simulated_timeline()
    assert real == simulated, "\n".join(f"{a}  |  {b}" for a, b in zip(real, simulated, strict=False))
    kinds = [k[0] for k in real]
    # what the timeline says: the chief handed from 0 to 1, then (slot 1 lost) to 2, not to slot 0's newcomer
    chiefs = [dict(k[3])["to"] for k in real if k[0] == "chief_change"]
    assert chiefs == [0, 1, 2] and kinds.count("lr_change") == 4 and kinds.count("join") == 5
