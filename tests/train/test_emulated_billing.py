"""Emulated servers are billed in the run's emulated cloud time (issue 43): a seeded emulated run costs the same on
a fast machine and on a slow one. Before, they were billed on the wall clock: the default `cmdare train` cost $0.0020
as it was and $0.0055 on a machine 3x slower, with the same revocations at the same steps."""

from __future__ import annotations

import time

import pytest

from cmdare.cloud.local import LocalProcessProvider, Server
from cmdare.cloud.servers import ServerSpec, cost_usd
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback

SPEC = ServerSpec("k80", "gcp", "us-central1", True, 0.135, "worker")


def test_a_server_is_billed_in_cloud_time_where_the_run_emulates_it():
    s = Server("w-0", SPEC, requested_at=1000.0, ready_at=1000.0, cloud_requested_at=50.0)
    assert s.billed_s(cloud_now=80.0, now=5000.0) == 30.0  # the wall's 4000 s do not count
    s.cloud_clock = lambda: 70.0
    s.end("released")
    assert s.billed_s(cloud_now=90.0, now=5000.0) == 20.0  # ended: from its request to its end
    unstarted = Server("w-1", SPEC, requested_at=1000.0, ready_at=1300.0, cloud_requested_at=50.0)
    unstarted.end("not_started", started=False)  # given up before it started
    assert unstarted.billed_s(cloud_now=90.0) == 0.0


def test_a_real_server_is_billed_on_the_wall_clock():
    s = Server("w-0", SPEC, requested_at=1000.0, ready_at=1000.0)
    assert s.billed_s(cloud_now=99.0, now=1100.0) == 100.0
    s.end("released")
    assert s.billed_s(cloud_now=99.0) == s.uptime_s() == s.ended_at - 1000.0


def test_the_provider_stamps_requests_and_ends_with_its_cloud_clock():
    provider = LocalProcessProvider()
    cloud = [10.0]
    provider.cloud_clock = lambda: cloud[0]
    s = provider.request(SPEC)
    cloud[0] = 25.5
    provider.release(s)
    assert (s.cloud_requested_at, s.cloud_ended_at, s.billed_s()) == (10.0, 25.5, 15.5)


class _SlowMachine(TrainCallback):
    """Stands for a slower machine: the driver is held ``delay_s`` at every chunk it hears of."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    def on_step(self, r):
        time.sleep(self.delay_s)


def _run(tmp_path, name: str, delay_s: float):
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=60, batch_size=32, chunk_steps=5,
                     checkpoint_every=0, eval_every=0, seed=5, transient=True, revocations="none", startup="0")
    trainer = Trainer(spec, [_SlowMachine(delay_s)], run_id=name, checkpoint_dir=tmp_path / name)
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 60
    return trainer, summary


def test_an_emulated_run_costs_the_same_on_a_slow_machine(local_ray, tmp_path):
    _, fast = _run(tmp_path, "fast", 0.0)
    slow_trainer, slow = _run(tmp_path, "slow", 0.5)
    assert slow.steps_per_s < fast.steps_per_s / 1.5  # the slow machine trained slower ...
    assert fast.cost_usd > 0 and slow.cost_usd == pytest.approx(fast.cost_usd, rel=0.02)  # ... and cost the same
    # the bill is the catalog price over each server's emulated cloud time (the wall would bill several times more)
    servers = slow_trainer.provider.servers
    cloud = sum(cost_usd(s.spec, s.billed_s(), whole_seconds=False) for s in servers)
    wall = sum(cost_usd(s.spec, s.uptime_s()) for s in servers)
    assert slow.cost_usd == pytest.approx(cloud) and wall > 1.5 * cloud
    assert all(s.cloud_ended_at is not None and s.cloud_ended_at >= s.cloud_requested_at for s in servers)


def test_the_simulation_of_a_train_command_bills_what_its_run_bills(local_ray, tmp_path):
    """The trainer and the planner on one spec (the cross-driver check of ``cmdare train --simulate``): a
    scheduled emulated run, 0.2 emulated seconds a worker step, 105 steps of two asynchronous workers."""
    from cmdare.plan.one_config import simulate_configuration
    from cmdare.run_simulation import simulation_inputs

    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=105, batch_size=32, chunk_steps=5,
                     checkpoint_every=50, eval_every=0, seed=2, transient=True, revocations="every=1000,step=0.2",
                     startup="0")
    trainer = Trainer(spec, [], run_id="billed", checkpoint_dir=tmp_path / "billed")
    summary = trainer.run()
    assert summary.status == "finished" and summary.global_step == 105
    predicted, _ = simulate_configuration(*simulation_inputs(spec, joined=False), runs=3, seed=spec.seed)
    assert predicted["time_s"]["mean"] == pytest.approx(10.5)  # 105 steps at 2 x 5 steps per emulated second
    # every server of the run was billed those 10.5 emulated seconds, as the simulation bills its servers
    servers = trainer.provider.servers
    assert len(servers) == 3 and all(s.billed_s() == pytest.approx(10.5) for s in servers)
    billed = sum(s.spec.price_per_hour_usd * s.billed_s() / 3600 for s in servers)
    assert billed == pytest.approx(predicted["cost_usd"]["mean"])
    # ... and the run's cost is that bill: emulated seconds are billed continuously, as the simulation bills them
    assert summary.cost_usd == pytest.approx(billed, rel=1e-9)
