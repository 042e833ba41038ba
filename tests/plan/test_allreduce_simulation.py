"""The simulator drives the run controller of an all-reduce run: its steps at the all-reduce speed, a loss costing a
re-formation (no steps lost while a member of the group lives), every member lost at once going back to the
newest checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_inprocess import one_error, run_cmdare
from cmdare.control import RevocationPlan, build_revocation_source
from cmdare.plan.adapters import load_plan_models
from cmdare.plan.sim_driver import REGROUP_S
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup

MODEL, STEPS = "t2t_resnet15", 20_000


def _cluster(transient: bool, n: int = 4) -> ClusterSpec:
    return ClusterSpec((WorkerGroup("v100", n, transient, "us-east1"),), ps=0, topology="allreduce")


@pytest.fixture(scope="module")
def models():
    return load_plan_models(MODEL)


def _runs(models, spec: str, runs: int = 5, checkpoint_every: int = 1000):
    job = JobSpec(MODEL, STEPS, checkpoint_every)
    plan = RevocationPlan.parse(spec, seed=0)

    def source():
        return build_revocation_source(plan, np.random.default_rng(0))

    sim = Simulator(job, _cluster(True), models, revocations=source, plan=plan)
    return sim, [sim.run_once(np.random.default_rng(seed)) for seed in range(runs)]


def test_an_on_demand_group_trains_at_the_all_reduce_speed(models):
    job = JobSpec(MODEL, STEPS, STEPS)  # one checkpoint, at the end
    sim = Simulator(job, _cluster(False), models)
    assert sim.base_time_s == pytest.approx(STEPS / models.speed.allreduce_steps_per_s({"v100": 4}), rel=0.01)
    assert "all-reduce" in _cluster(False).label()


def test_losses_cost_regroups_and_waiting_not_steps(models):
    sim, results = _runs(models, "every=60")
    assert all(r.revocations >= 5 and r.steps_lost == 0 for r in results)
    assert all(r.wall_time_s > sim.base_time_s for r in results)  # 3 members cover a step's samples slower
    assert REGROUP_S > 0


def test_every_member_lost_at_once_goes_back_to_the_checkpoint(models):
    _, results = _runs(models, "trace=120@0+120@1+120@2+120@3", runs=1, checkpoint_every=1000)
    (r,) = results
    assert r.revocations == 4 and 0 < r.steps_lost <= 1000


def test_plan_simulate_takes_the_topology_and_refuses_a_ps_with_it(tmp_path):
    base = ["plan", "simulate", "--model", MODEL, "--steps", "2000", "--workers", "v100:4", "--runs", "3"]
    code, out, _ = run_cmdare(tmp_path, *base, "--topology", "allreduce", "--json")
    doc = json.loads(out)
    assert code == 0 and any("all-reduce: a step trains one batch per member" in n for n in doc["notes"])
    assert one_error(run_cmdare(tmp_path, *base, "--topology", "allreduce", "--ps", "2"),
                     "--topology allreduce has no parameter server")
    assert one_error(run_cmdare(tmp_path, *base, "--topology", "mesh"), "unknown --topology 'mesh'")
