"""``cmdare train ... --simulate`` (issue 43): the run a command line would start, simulated instead of trained,
through the real CLI entry point. A local run is simulated in its emulated cloud time; every option the
simulator cannot honour is named."""

from __future__ import annotations

import json
import math

import pytest
from plan_toys import run_cli

from cmdare.cloud.catalog import default_catalog


def _simulate(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, "train", "--simulate", "--runs", "10", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_the_main_job_is_simulated_in_its_emulated_cloud_time_and_trains_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path))
    data = _simulate(monkeypatch, capsys)
    assert (data["model"], data["dataset"], data["steps"], data["workers"], data["ps"]) == \
        ("resnet15", "digits", 500, {"k80": 2}, 1)
    assert data["clock"].startswith("emulated cloud time") and data["lifetime_models"]["k80"].endswith("/ 7200")
    # lifetimes compressed 7200x: a 500-step run of seconds sees servers revoked, as the main job does
    assert data["revocations_mean"] > 1 and data["replacements_mean"] == data["revocations_mean"]
    assert 0 < data["time_s"]["mean"] < 60 and 0 < data["cost_usd"]["mean"] < 0.05
    assert data["accuracy"] == {"mean": None, "p5": None}  # the accuracy points are CIFAR-10's, not digits'
    assert data["not_simulated"] == []
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "cmdare.db").exists()  # nothing trained


def test_a_scheduled_emulated_run_is_exact_time_and_cost(monkeypatch, capsys):
    # every worker step 0.2 emulated seconds, two asynchronous workers: 500 steps are 50 s of cloud time; the
    # servers (2 K80 spot workers and the PS) are billed for them; the schedule revokes nothing before 1000 s
    data = _simulate(monkeypatch, capsys, "--revocations", "every=1000,step=0.2", "--startup", "0")
    assert data["time_s"]["mean"] == pytest.approx(50.0)
    assert data["revocations_mean"] == 0
    catalog = default_catalog()
    region = data["region"]
    per_hour = 2 * catalog.server_spec("k80", "gcp", region, True).price_per_hour_usd + \
        catalog.server_spec(None, "gcp", region, False, role="ps").price_per_hour_usd
    assert data["cost_usd"]["mean"] == pytest.approx(per_hour * 50.0 / 3600)
    # synchronous rounds wait for the slowest worker: one step per 0.2 s, 100 s in all
    sync = _simulate(monkeypatch, capsys, "--revocations", "every=1000,step=0.2", "--startup", "0", "--sync")
    assert sync["time_s"]["mean"] == pytest.approx(100.0)


def test_every_option_the_simulator_cannot_honour_is_named(monkeypatch, capsys):
    data = _simulate(monkeypatch, capsys, "--placement", "psld", "--elastic-ps", "--on-diverge", "rollback",
                     "--lr", "0.1")
    named = " ".join(data["not_simulated"])
    for option in ("--placement", "--elastic-ps", "--on-diverge", "--lr"):
        assert option in named
    assert data["notes"][-1].startswith("not simulated: --placement (the speed model knows no parameter placement)")
    code, out, _ = run_cli(monkeypatch, capsys, "train", "--simulate", "--runs", "5", "--placement", "psld")
    assert code == 0 and "note: not simulated: --placement" in out and "emulated cloud time" in out


def test_warm_spares_are_simulated_a_replacement_takes_one_instead_of_starting_cold(monkeypatch, capsys):
    # every worker step 0.2 emulated s (2 workers: 10 steps/s), a revocation every 10 s from 5 s, each server's
    # start-up 60 s: a cold replacement leaves its slot empty for a minute, a warm spare fills it at once (and
    # another starts in its place)
    args = ("--steps", "2000", "--revocations", "every=10,first=5,step=0.2", "--startup", "60")
    cold = _simulate(monkeypatch, capsys, *args)
    warm = _simulate(monkeypatch, capsys, *args, "--warm-spares", "2")
    assert warm["not_simulated"] == [] and warm["config"].endswith("+ 1 PS + 2 warm spares @us-central1")
    assert cold["replacements_mean"] == cold["revocations_mean"] > 20
    assert warm["deterministic_time_s"] == cold["deterministic_time_s"] == pytest.approx(200.0)
    assert warm["time_s"]["mean"] < 0.6 * cold["time_s"]["mean"]  # measured 655 s against 1,345 s
    # a spare is billed like a worker: without revocations it costs one more K80 spot server for the whole run
    quiet = ("--steps", "2000", "--revocations", "every=1000,step=0.2", "--startup", "60")
    alone, spared = _simulate(monkeypatch, capsys, *quiet), _simulate(monkeypatch, capsys, *quiet, "--warm-spares", "1")
    k80 = default_catalog().server_spec("k80", "gcp", alone["region"], True).price_per_hour_usd
    assert spared["time_s"]["mean"] == alone["time_s"]["mean"] == pytest.approx(200.0)
    assert spared["cost_usd"]["mean"] - alone["cost_usd"]["mean"] == pytest.approx(k80 * 200.0 / 3600)


def test_a_joined_run_is_simulated_in_real_time_with_what_that_ignores(monkeypatch, capsys):
    data = _simulate(monkeypatch, capsys, "--address", "127.0.0.1:1", "--transient", "--revocations",
                     "lifetime=bathtub", "--batch-size", "64", "--steps", "2000")
    assert data["clock"].startswith("real cloud time") and data["lifetime_models"]["k80"].startswith("bathtub")
    assert data["replacement_timeout_s"] == 600.0  # --replacement-timeout applies on a joined cluster
    named = " ".join(data["not_simulated"])
    assert "--batch-size" not in named and "--eval-every" in named
    # the batch is simulated: a step of 64 samples takes longer than one of train's default 32
    small = _simulate(monkeypatch, capsys, "--address", "127.0.0.1:1", "--transient", "--revocations",
                      "lifetime=bathtub", "--steps", "2000")
    assert data["deterministic_time_s"] > small["deterministic_time_s"]
    # nothing injected on a joined cluster (its default): its spot servers are revoked by their market
    market = _simulate(monkeypatch, capsys, "--address", "127.0.0.1:1", "--steps", "1000000", "--workers", "k80:4")
    assert market["revocations"] == "none" and market["lifetime_models"]["k80"] == "bathtub:k80 (gcp preemptible)"
    assert market["revocations_mean"] > 0  # 6.5 h of 4 preemptible K80s


@pytest.mark.parametrize(("args", "needle"), [
    (["--runs", "5"], "--runs and --json go with --simulate"),
    (["--runs", "100"], "--runs and --json go with --simulate"),  # given, though the default
    (["--json"], "--runs and --json go with --simulate"),
    (["--simulate", "--runs", "0"], "--runs must be at least 1"),
    (["--simulate", "--resume", "run-x"], "leave out --resume"),
    (["--simulate", "--replacement", "nope"], "replacement"),
    (["--simulate", "--revocations", "lifetime=nosuch"], "nosuch"),
])
def test_bad_simulate_options_are_one_line(monkeypatch, capsys, tmp_path, args, needle):
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path))
    code, out, err = run_cli(monkeypatch, capsys, "train", *args)
    assert code == 1 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _steps(command: str, batches: int) -> int:
    """The steps a plan's train command trains ``batches`` asynchronous PS steps' batches in: as many through a PS,
    ``batches / n`` group steps of ``n`` all-reduce members."""
    if "--topology allreduce" not in command:
        return batches
    workers = command.split("--workers ", 1)[1].split()[0]
    return math.ceil(batches / sum(int(part.split(":")[1]) for part in workers.split(",")))


def test_plan_prints_the_train_command_of_its_choice_and_that_command_simulates_to_the_plan(monkeypatch, capsys):
    plan = ["plan", "--model", "t2t_resnet32", "--steps", "64000", "--deadline", "20min", "--runs", "10"]
    code, out, err = run_cli(monkeypatch, capsys, *plan, "--json")
    assert code == 0, err
    rec = json.loads(out)
    command = rec["choice"]["train_command"]
    assert command.startswith(f"cmdare train --model t2t_resnet32 --steps {_steps(command, 64000)} --workers ")
    # every configuration of the front has one, but single-server training (no PS), which `train` does not do
    assert all(bool(o["train_command"]) == ("no PS" not in o["config"]) for o in rec["front"])
    # runnable as printed: on the cluster (--address auto), simulated, it is the plan's choice
    args = command.split()[2:]
    sim = _simulate(monkeypatch, capsys, *args, "--address", "auto")
    assert sim["config"] == rec["choice"]["config"]
    assert sim["time_s"]["mean"] == pytest.approx(rec["choice"]["time_mean_s"], rel=0.01)
    assert sim["cost_usd"]["mean"] == pytest.approx(rec["choice"]["cost_mean_usd"], rel=0.01)
    code, out, _ = run_cli(monkeypatch, capsys, *plan)
    assert code == 0 and f"  {command} --address auto" in out and "cmdare cluster-config --cloud gcp" in out
    # a batch other than train's default is part of the command, and simulates to the plan too
    code, out, err = run_cli(monkeypatch, capsys, *plan, "--batch-size", "128", "--json")
    assert code == 0, err
    rec = json.loads(out)
    command = rec["choice"]["train_command"]
    assert command.startswith(f"cmdare train --model t2t_resnet32 --steps {_steps(command, 64000)} --batch-size 128 "
                              "--workers ")
    sim = _simulate(monkeypatch, capsys, *command.split()[2:], "--address", "auto")
    assert sim["config"] == rec["choice"]["config"]
    assert sim["time_s"]["mean"] == pytest.approx(rec["choice"]["time_mean_s"], rel=0.01)


def test_spot_parameter_servers_are_evacuated_free_of_emulated_cloud_time(monkeypatch, capsys):
    # a local run's PS evacuation moves real blocks but takes no cloud time (only steps move the clock): the noticed
    # shards are evacuated, nothing is rolled back, and the run takes its revocation-free time
    data = _simulate(monkeypatch, capsys, "--ps", "2", "--ps-transient", "--revocations",
                     "every=2,first=1,step=0.2,hit=ps", "--startup", "0")
    assert data["config"] == "2xK80 spot + 2 PS spot @us-central1"
    assert data["evacuations_mean"] > 0 and data["steps_lost_mean"] == 0
    assert data["time_s"]["mean"] == pytest.approx(data["deterministic_time_s"]) == pytest.approx(50.0)


def test_the_first_simulated_run_with_a_seed_revokes_what_the_emulated_run_with_that_seed_revokes(
        monkeypatch, capsys, tmp_path):
    """A local run's injected lifetimes are simulated as its trainer draws them (the same model, compression and
    random stream): ``--simulate --runs 1 --seed S`` sees the revocations and replacements the emulated run with
    seed S sees (measured: 7 and 7, 8 and 8 for seeds 1 and 2)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    args = ("--steps", "300", "--seed", "2", "--revocations", "lifetime=bathtub,speedup=30000")
    cmdare = str(Path(sys.executable).parent / "cmdare")
    trained = subprocess.run([cmdare, "train", *args, "--tensorboard", "none"], capture_output=True, text=True,
                             timeout=600, env={**os.environ, "CMDARE_HOME": str(tmp_path)})
    assert trained.returncode == 0, trained.stderr[-2000:]
    counts = re.search(r"servers: (\d+) revoked, (\d+) replaced", trained.stdout)
    assert counts, trained.stdout[-2000:]
    revoked, replaced = map(int, counts.groups())
    assert revoked >= 3  # enough to tell draws apart
    code, out, err = run_cli(monkeypatch, capsys, "train", "--simulate", "--runs", "1", "--json", *args)
    assert code == 0, err
    simulated = json.loads(out)
    assert simulated["runs"] == 1
    assert (simulated["revocations_mean"], simulated["replacements_mean"]) == (revoked, replaced)


@pytest.mark.parametrize("gpus", [None, "k80:1,v100:1"])
def test_cheapest_chooses_from_the_same_offers_in_the_trainer_and_in_its_simulation(gpus):
    """``--replacement cheapest``: the trainer's controller and the simulation of the same command line offer a
    replacement the same servers (every transient offering of the lost server's cloud, any region, at the speed
    the run trains at on each type), so both rent the same one."""
    from cmdare.control import NoRevocations, RevocationPlan
    from cmdare.plan.simulator import Simulator
    from cmdare.run_simulation import simulation_inputs
    from cmdare.train.run.controller_setup import build_controller
    from cmdare.train.run.run_start import server_specs
    from cmdare.train.spec import TrainSpec

    spec = TrainSpec(model="resnet15", workers=2, worker_gpus=gpus, transient=True, replace="cheapest",
                     revocations="every=5")
    controller = build_controller(spec, RevocationPlan.parse(spec.revocations), NoRevocations(), "r", real=False)
    job, cluster, models, _sources = simulation_inputs(spec, joined=False)
    simulator = Simulator(job, cluster, models)
    for lost in server_specs(spec)[0]:
        trained = list(controller.kernel.offers(lost))
        simulated = list(simulator.offers(lost))
        assert trained == simulated
        assert len({o.spec.region for o in trained}) > 1 and len({o.spec.gpu_type for o in trained}) > 1
        pick = controller.kernel.replacement.decide(lost, trained)
        assert pick == controller.kernel.replacement.decide(lost, simulated)


def test_a_simulated_local_run_draws_the_start_ups_its_trainer_draws():
    """The trainer draws a start-up for every server it starts (the shards, the first wave's workers, then each
    replacement), the framework's phase left out (a local process start takes no emulated time); the first
    simulated run with the seed draws the replacements' start-ups from the same stream; the next run its own."""
    import numpy as np

    from cmdare.cloud.local import StartupDelay
    from cmdare.cloud.servers import ServerSpec
    from cmdare.plan.emulation import TrainerStartups
    from cmdare.predict import startup_model
    from cmdare.run_simulation import simulation_inputs
    from cmdare.train.spec import TrainSpec

    spec = TrainSpec(workers=2, ps=1, transient=True, seed=3, revocations="lifetime=bathtub,speedup=7200")
    _job, _cluster, models, _sources = simulation_inputs(spec, joined=False)
    assert isinstance(models.startup, TrainerStartups)
    trainer = StartupDelay("model", 7200, 3, model=startup_model)
    worker = ServerSpec("k80", "gcp", "us-central1", True, 0.45, "worker")
    first_wave = [ServerSpec(None, "gcp", "us-central1", False, 0.05, "ps"), worker, worker]
    for server in first_wave:
        trainer.sample(server)
    replacements = [trainer.wall_s(trainer.sample(worker)) for _ in range(3)]
    run = np.random.default_rng(0)
    assert [models.startup.sample(run, "k80", True, "us-central1") for _ in range(3)] == replacements
    assert models.startup.sample(np.random.default_rng(1), "k80", True, "us-central1") != replacements[0]
