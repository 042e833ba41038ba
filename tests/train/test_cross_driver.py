"""One event script, two drivers: the Ray trainer (emulated, on a local multi-node cluster) and the SimPy
simulator drive the same run controller, and take the same decisions at the same cloud times.

The script: three K80 workers, each step 0.05 emulated seconds (``step=0.05``: 60 global steps per second
with three workers); slot 0 (the chief) revoked 2 s after the first step, slot 1 (the next chief) at 6 s; every
replacement ready 1.5 s after it is asked for. The simulator gets the same speeds (20 steps/s per worker) and
start-up, so cloud time means the same in both.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cmdare.cloud.local import LocalClusterProvider, StartupDelay
from cmdare.cloud.servers import ServerSpec
from cmdare.control import TraceRevocations
from cmdare.control import run_commands as C
from cmdare.plan.replay import FixedStartup, FlatPrices, MeasuredSpeed, ScriptedLifetimes
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import ClusterSpec, JobSpec, PlanModels, WorkerGroup
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.cli.train_cmd import DEFAULT_REVOCATIONS

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


#: The block moves of an evacuation or a fill are planned by the controller on the shards' placement, which the
#: simulator does not keep (it has no model to place): they are left out here (the controller's plans:
#: tests/control/test_run_controller.py; PSLD's, carried out on Ray with no value changed: tests/train/test_spot_ps.py).
#: What only one driver can decide: liveness probes (wall-clock silence), the chief's periodic duties (virtual in
#: the simulator: taken the moment their step passes) and the placement sources' measurements and reports.
_ONE_DRIVER_ONLY = (C.Train, C.Fence, C.HoldAll, C.Probe, C.StartDuty, C.Balance, C.Note)


def _comparable(value):
    """Times to a millionth (emulated time is summed in another order); a GPU type as either spells it (the
    catalog ``K80``, the simulator's cluster ``k80``)."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, ServerSpec):
        return dataclasses.replace(value, gpu_type=value.gpu_type.lower() if value.gpu_type else None)
    return value


def _history(controller) -> list[tuple]:
    """A run's decisions in order, with the step each was taken at and what it does (not why)."""
    out = []
    for _now, step, c in controller.history:
        if not isinstance(c, _ONE_DRIVER_ONLY):
            fields = {k: _comparable(v) for k, v in c.__dict__.items() if k not in ("why", "state", "moves")}
            out.append((type(c).__name__, round(float(step), 6), tuple(sorted(fields.items()))))
    return out


@pytest.mark.cluster  # make test-cluster: five emulated runs against their simulations
@pytest.mark.parametrize("line, shows", [
    ({"transient": True}, {"Revoke", "Joined"}),  # a worker revoked, replaced (the default lifetimes)
    # a PS notice shorter than a step: the shards roll back
    ({"transient": True, "ps_transient": True, "checkpoint_every": 50}, {"KillPs", "Restore"}),
    ({"transient": True, "warm_spares": 2}, {"StartSpare"}),  # a replacement takes a warm spare, another is asked for
    ({"transient": True, "sync": True}, {"SetRoundSize"}),  # the replacement joins a round at the step it is ready
    # slot 1 revoked at cloud second 2 (step 200), its replacement's start-up longer than the run: cancelled at the end
    ({"transient": True, "workers": 2, "checkpoint_every": 100, "revocations": "trace=2@1,step=0.02"},
     {"CancelWorker"}),
], ids=["revocations", "ps-rollback", "warm-spares", "sync", "cancel"])
def test_a_command_line_trained_and_simulated_takes_the_same_decisions_at_the_same_steps(line, shows, tmp_path):
    """``cmdare train LINE --seed 3`` (the emulated Ray run) and the first run of ``cmdare train LINE --seed 3
    --simulate``: the same decisions, with the same arguments, at the same global steps (among them ``shows``)."""
    decisions = assert_trained_as_simulated(line, tmp_path)
    assert shows <= {name for name, _step, _fields in decisions}


def assert_trained_as_simulated(line: dict, tmp_path) -> list[tuple]:
    """Train ``line`` (``TrainSpec`` fields) emulated on Ray with seed 3 and simulate its first run: the same
    decisions, with the same arguments, at the same global steps. Returns them (name, step, fields)."""
    from cmdare.plan.simulator import Simulator
    from cmdare.run_simulation import simulation_inputs

    spec = TrainSpec(seed=3, **{"steps": 300, "revocations": DEFAULT_REVOCATIONS, "checkpoint_every": 200, **line})
    trainer = Trainer(spec, checkpoint_dir=tmp_path)
    summary = trainer.run()
    assert summary.status == "finished" and summary.revocations >= 1
    job, cluster, models, sources = simulation_inputs(spec, joined=False)
    factory, plan = sources()
    simulator = Simulator(job, cluster, models, revocations=factory, plan=plan)
    word = np.random.SeedSequence(spec.seed).generate_state(1, dtype=np.uint64)[0]  # the first run's stream
    run = simulator._run(np.random.Generator(np.random.PCG64(int(word))))
    assert run.result().finished
    trained, simulated = _history(trainer.controller), _history(run.controller)
    assert trained == simulated, "\n".join(f"{a}  |  {b}" for a, b in zip(trained, simulated, strict=False))
    return trained
