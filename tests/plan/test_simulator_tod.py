"""Time-of-day-aware lifetimes in the simulator: a server draws from the model of the hour it is
requested, runs stay deterministic, common random numbers hold, and ``--start-hour`` is validated."""

from __future__ import annotations

import json

import numpy as np
import pytest
from plan_toys import ExpLifetimes, run_cli, toy_models

from cmdare.errors import UserInputError
from cmdare.plan.adapters import QuantileLifetimes
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import ClusterSpec, JobSpec, TimeOfDayLifetimeSampler, WorkerGroup

HOUR_S = 3600.0


class DayNightLifetimes:
    """Servers launched 00-12 h live 11 h (plus up to a minute); those launched 12-24 h live 10 min.

    Records every (hour, uniform, lifetime) it is asked for.
    """

    def __init__(self):
        self.calls: list[tuple[float, float, float]] = []

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        return self.lifetimes_at(rng.random(size), server, region, 6.0)

    def lifetimes_at(self, u: np.ndarray, server: str, region: str, launch_hour: float) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        out = (11 * HOUR_S if launch_hour < 12 else 600.0) + 60.0 * u
        self.calls += [(float(launch_hour), float(a), float(b)) for a, b in zip(u, out, strict=True)]
        return out


def one_worker(n: int = 1) -> ClusterSpec:
    return ClusterSpec((WorkerGroup("a", n, True, "r"),), ps=1, region="r")


def test_a_replacement_draws_from_the_model_of_the_hour_it_is_ready():
    lifetimes = DayNightLifetimes()
    assert isinstance(lifetimes, TimeOfDayLifetimeSampler)
    # 1 step/s for 12 h of steps: the first worker (launched 01:00) lives ~11 h, is replaced at ~12:00,
    # and the replacement, ready in the afternoon (50 s after its request), lives 10 min.
    job = JobSpec("toy", int(12 * HOUR_S), start_hour=1)
    run = Simulator(job, one_worker(), toy_models(lifetimes, startup_s=50.0)).run_once(np.random.default_rng(0))
    first, second = lifetimes.calls[0], lifetimes.calls[1]
    assert first[0] == 1.0 and first[2] >= 11 * HOUR_S
    # its lifetime starts when it is ready, as in the trainer: 50 s of start-up after the first died
    assert second[0] == pytest.approx((1.0 + (first[2] + 50.0) / HOUR_S) % 24)
    assert second[0] >= 12.0 and second[2] < 700.0
    assert run.revocations >= 3 and run.replacements == run.revocations  # afternoon servers die fast
    # The same job started in the afternoon: every server is short-lived from the start.
    late = DayNightLifetimes()
    Simulator(JobSpec("toy", 3600, start_hour=13), one_worker(), toy_models(late)).run_once(np.random.default_rng(0))
    assert late.calls[0][0] == 13.0 and late.calls[0][2] < 700.0
    # Without a start hour the sampler's hour-agnostic sample() is used: one 11 h life, one revocation.
    plain = Simulator(JobSpec("toy", int(12 * HOUR_S)), one_worker(), toy_models(DayNightLifetimes()))
    assert plain.run_once(np.random.default_rng(0)).revocations == 1


def test_night_and_day_starts_differ_and_each_is_deterministic():
    models = toy_models(DayNightLifetimes())
    night = Simulator(JobSpec("toy", 20000, start_hour=2), one_worker(4), models)
    day = Simulator(JobSpec("toy", 20000, start_hour=14), one_worker(4), models)
    a, b = night.run_many(30, seed=7), night.run_many(30, seed=7)
    assert a == b
    assert night.run_many(10, seed=7) == a[:10]  # run i does not depend on the number of runs
    assert np.mean([r.revocations for r in a]) == 0  # 5,000 s on 4 workers that live 11 h
    assert np.mean([r.revocations for r in day.run_many(30, seed=7)]) > 4


def test_slot_major_uniforms_are_the_hour_agnostic_ones():
    # Common random numbers: the time-of-day path draws the same slot-major uniforms as the
    # hour-agnostic path, so with the pooled model at every hour (K80: no bucket of its own) the runs
    # are identical, and the uniforms of 4 workers are the first of those of 8 workers.
    cluster = ClusterSpec((WorkerGroup("a", 8, True, "r"),), ps=1, region="r")
    models = toy_models(_AsK80(QuantileLifetimes("empirical")))
    job = JobSpec("toy", 200_000)
    agnostic = Simulator(job, cluster, models).run_many(20, seed=3)
    for hour in (3, 15):
        assert Simulator(JobSpec("toy", 200_000, start_hour=hour), cluster, models).run_many(20, seed=3) == agnostic
    recorder = DayNightLifetimes()
    small, big = (ClusterSpec((WorkerGroup("a", n, True, "r"),), ps=1, region="r") for n in (4, 8))
    Simulator(JobSpec("toy", 10, start_hour=2), small, toy_models(recorder)).run_once(np.random.default_rng(1))
    u4 = [c[1] for c in recorder.calls[:4]]
    recorder.calls.clear()
    Simulator(JobSpec("toy", 10, start_hour=2), big, toy_models(recorder)).run_once(np.random.default_rng(1))
    u8 = [c[1] for c in recorder.calls[:8]]
    # slot-major: 3 uniforms per slot, the first of each slot inverted at the start
    assert u8 == np.random.default_rng(1).random(24).reshape(8, 3)[:, 0].tolist()
    assert u4 == np.random.default_rng(1).random(12).reshape(4, 3)[:, 0].tolist()


class _AsK80:
    """The real adapter with the toy GPU ``a`` standing for a K80."""

    def __init__(self, inner: QuantileLifetimes):
        self.inner = inner

    def sample(self, rng, server, region, size):
        return self.inner.sample(rng, "k80" if server == "a" else server, region, size)

    def lifetimes_at(self, u, server, region, launch_hour):
        return self.inner.lifetimes_at(u, "k80" if server == "a" else server, region, launch_hour)


def test_adapter_uses_the_bucket_model_of_the_hour():
    q = QuantileLifetimes("empirical")
    u = np.linspace(0, 0.999, 400)
    np.testing.assert_array_equal(q.lifetimes_at(u, "k80", "us-east1", 3.0), q.lifetimes_at(u, "k80", "x", 15.0))
    night, evening = q.lifetimes_at(u, "cpu", "us-east1", 2.0), q.lifetimes_at(u, "cpu", "us-east1", 20.0)
    assert not np.array_equal(night, evening)  # CPU 00-06 h has its own model; 18-24 h is pooled
    pooled = q.sample(np.random.default_rng(0), "cpu", "us-east1", 5)
    again = q.lifetimes_at(np.random.default_rng(0).random(5), "cpu", "us-east1", 20.0)
    np.testing.assert_array_equal(pooled, again)
    assert np.all(np.diff(night) >= 0)  # monotone in u
    assert "own models" in q.sources["cpu"]
    pinned = QuantileLifetimes("empirical:cpu")  # pinned to one type: hour-agnostic
    np.testing.assert_array_equal(pinned.lifetimes_at(u, "cpu", "r", 2.0), pinned.lifetimes_at(u, "cpu", "r", 20.0))


def test_a_sampler_without_hours_ignores_the_start_hour():
    models = toy_models(ExpLifetimes(3000.0))
    with_hour = Simulator(JobSpec("toy", 20000, start_hour=5), one_worker(3), models)
    assert with_hour.start_hour is None
    assert with_hour.run_many(10, 1) == Simulator(JobSpec("toy", 20000), one_worker(3), models).run_many(10, 1)


@pytest.mark.parametrize("hour", [-1, 24, 25.5])
def test_job_spec_rejects_hours_outside_the_day(hour):
    with pytest.raises(UserInputError, match="hour of day 0-23"):
        JobSpec("toy", 10, start_hour=hour)


SIM = ["plan", "simulate", "--model", "t2t_resnet32", "--steps", "64000", "--workers", "k80:4", "--transient",
       "--ps-transient", "--runs", "10", "--seed", "2", "--json"]


@pytest.mark.parametrize("cmd", [SIM, ["plan", "--model", "t2t_resnet32", "--steps", "64000", "--runs", "5"]])
@pytest.mark.parametrize("hour", ["24", "-3"])
def test_cli_bad_start_hour_is_one_line(monkeypatch, capsys, cmd, hour):
    code, _, err = run_cli(monkeypatch, capsys, *cmd, "--start-hour", hour)
    assert code == 1 and "--start-hour must be an hour of day 0-23" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_start_hour_is_deterministic_and_reported(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, *SIM, "--start-hour", "14")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["start_hour"] == 14 and "launch hour" in data["models"]
    again = json.loads(run_cli(monkeypatch, capsys, *SIM, "--start-hour", "14")[1])
    assert again["time_s"] == data["time_s"] and again["cost_usd"] == data["cost_usd"]
    plain = json.loads(run_cli(monkeypatch, capsys, *SIM)[1])
    assert plain["start_hour"] is None and "launch hour" not in plain["models"]


def test_cli_plan_with_a_start_hour_recommends(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--gpus",
                             "k80", "--max-workers", "2", "--max-ps", "1", "--runs", "5", "--start-hour", "3", "--json")
    assert code == 0 and err == ""
    rec = json.loads(out)
    assert rec["choice"] is not None and rec["front"] and "K80" in rec["choice"]["config"]
