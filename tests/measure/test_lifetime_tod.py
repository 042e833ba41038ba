"""Time-of-day lifetime models: launch-hour buckets, fallback to the pooled model, significance gate,
persistence, the shipped defaults and the measured statistics of the public data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from measure_testdata import LIFETIME_CSV

from cmdare.errors import DataFormatError, UnknownNameError, UserInputError
from cmdare.measure.importers.lifetimes import read_lifetimes_file
from cmdare.measure.lifetime_models import ExponentialLifetime, load_lifetime_model
from cmdare.measure.lifetime_tod import (
    TimeOfDayLifetime,
    bucket_of,
    clock_hour,
    load_tod_model,
    time_of_day_stats,
)

# Two K80s launched at night (01:10, 05:50), one at 07:00, one at 13:30 and two at 19:00/23:59; the
# 23:59 one runs past midnight.
SHEET = """K80,,
VM name,Start,Terminate
a-us-east1-b-0,2/18/19 1:10,2/18/19 2:10
a-us-east1-b-1,2/18/19 5:50,2/18/19 8:50
a-us-east1-b-2,2/18/19 7:00,2/19/19 7:05
a-us-west1-b-0,2/18/19 13:30,2/18/19 15:30
a-us-west1-b-1,2/18/19 19:00,2/18/19 19:30
a-us-west1-b-2,2/18/19 23:59,2/19/19 0:59
"""


def test_bucket_split_of_a_hand_made_sheet(tmp_path):
    path = tmp_path / "lifetimes.csv"
    path.write_text(SHEET)
    obs = read_lifetimes_file(path).rows["lifetime_observations"]
    hours = [clock_hour(o) for o in obs]
    # Sheet times are wall-clock times of the data's clock: read back unchanged.
    assert hours == pytest.approx([1 + 10 / 60, 5 + 50 / 60, 7.0, 13.5, 19.0, 23 + 59 / 60])
    assert [bucket_of(h) for h in hours] == [0, 0, 1, 2, 3, 3]
    assert bucket_of(24.5) == 0 and bucket_of(11.99, bucket_hours=12) == 0 and bucket_of(12, 12) == 1
    rows = time_of_day_stats([o["lifetime_s"] for o in obs], hours)
    assert [r["n"] for r in rows] == [2, 1, 1, 2]
    assert [r["hours"] for r in rows] == ["00-06 h", "06-12 h", "12-18 h", "18-24 h"]
    night = rows[0]
    assert night["mean_h"] == pytest.approx(2.0) and night["median_h"] == pytest.approx(1.0)
    assert night["revoked_before_24h"] == 1.0 and rows[1]["revoked_before_24h"] == 0.0  # 24 h 5 min
    assert night["vs_n"] == 4 and 0 < night["ks_p"] <= 1


def test_clock_of_timezone_aware_sources_is_us_pacific():
    # 2019-03-25 19:22:36 UTC is 12:22:36 PDT.
    obs = {"source": "hpdc2020-gce-cpu", "start": 1553541756.614}
    assert clock_hour(obs) == pytest.approx(12 + 22 / 60 + 36.614 / 3600, abs=1e-3)
    assert clock_hour({"source": "x", "start": None}) is None


def _two_populations(n_day: int, n_night: int, night_mean_s: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = np.concatenate([rng.exponential(20 * 3600, n_day), rng.exponential(night_mean_s, n_night)])
    hours = np.concatenate([rng.uniform(12, 18, n_day), rng.uniform(0, 6, n_night)])
    return t, hours


def test_small_buckets_fall_back_to_the_pooled_model():
    t, hours = _two_populations(40, 10, 600.0)
    model = TimeOfDayLifetime.fit("exponential", t, hours, min_vms=30, max_p=None)
    assert set(model.buckets) == {2}  # 40 afternoon VMs; 10 at night are too few
    assert model.model_at(14.0) is model.buckets[2]
    assert model.model_at(3.0) is model.pooled and model.model_at(9.0) is model.pooled
    assert model.model_at(None) is model.pooled
    assert model.pooled.mean_s_ == pytest.approx(t.sum() / t.size)
    assert model.buckets[2].mean_s_ == pytest.approx(t[:40].mean())
    assert model.meta["n_per_bucket"] == {"0": 10, "1": 0, "2": 40, "3": 0}


def test_buckets_get_their_own_model_only_where_the_hour_matters():
    t, hours = _two_populations(60, 60, 600.0)
    differs = TimeOfDayLifetime.fit("empirical", t, hours)
    assert set(differs.buckets) == {0, 2}
    assert differs.buckets[0].meta["ks_p_vs_rest"] < 0.05
    same, same_hours = _two_populations(60, 60, 20 * 3600, seed=1)
    alike = TimeOfDayLifetime.fit("empirical", same, same_hours)
    assert alike.buckets == {}  # same distribution at every hour: the pooled model everywhere
    assert set(TimeOfDayLifetime.fit("empirical", same, same_hours, max_p=None).buckets) == {0, 2}


@pytest.mark.parametrize("base", ["exponential", "empirical", "bathtub"])
def test_round_trip_through_json(base):
    t, hours = _two_populations(50, 50, 1800.0, seed=2)
    model = TimeOfDayLifetime.fit(base, t, hours, max_p=None)
    again = TimeOfDayLifetime.from_dict(json.loads(json.dumps(model.to_dict())))
    grid = np.linspace(0, 30 * 3600, 50)
    for hour in (None, 1.0, 7.0, 13.0, 19.0):
        np.testing.assert_allclose(again.cdf(grid, hour), model.cdf(grid, hour))
        a = again.sample(np.random.default_rng(5), 100, hour)
        np.testing.assert_array_equal(a, model.sample(np.random.default_rng(5), 100, hour))
    assert again.bucket_hours == 6 and again.min_vms == 30 and again.meta == model.meta
    night, day = again.sample(np.random.default_rng(0), 2000, 2.0), again.sample(np.random.default_rng(0), 2000, 14.0)
    assert night.mean() < day.mean() / 3


def test_bad_inputs():
    pooled = ExponentialLifetime(3600.0)
    with pytest.raises(UserInputError, match="divide 24"):
        TimeOfDayLifetime(pooled, bucket_hours=5)
    with pytest.raises(UserInputError, match="out of range"):
        TimeOfDayLifetime(pooled, {4: pooled})
    with pytest.raises(UserInputError, match="launch hours"):
        TimeOfDayLifetime.fit("exponential", [1.0, 2.0], [3.0])
    with pytest.raises(DataFormatError, match="tod"):
        TimeOfDayLifetime.from_dict({"model": "exponential", "params": {}})
    with pytest.raises(UnknownNameError, match="valid: exponential, bathtub, empirical"):
        load_tod_model("weibull:k80")
    with pytest.raises(UnknownNameError, match="cpu"):
        load_tod_model("bathtub:a100")


def test_censored_buckets_use_a_deterministic_permutation_test():
    t, hours = _two_populations(40, 40, 900.0, seed=3)
    censored = np.zeros(t.size, bool)
    censored[::5] = True
    a = time_of_day_stats(t, hours, censored, permutations=99)
    b = time_of_day_stats(t, hours, censored, permutations=99)
    assert a == b
    assert a[0]["ks_p"] == pytest.approx(0.01)  # 1 / (99 + 1): no permutation beats the real split
    assert a[0]["revoked"] == 32


def test_shipped_defaults():
    cpu = load_tod_model("bathtub:cpu")
    # Only CPU servers (1,442 VMs) show a significant hour effect; bucket 18-24 h stays pooled.
    assert set(cpu.buckets) == {0, 1, 2}
    grid = np.linspace(0, 90000, 40)
    np.testing.assert_allclose(cpu.cdf(grid, 20.0), load_lifetime_model("bathtub:cpu").cdf(grid))
    for gpu in ("k80", "p100", "v100"):  # too few, batch-launched VMs: the pooled model at every hour
        model = load_tod_model(f"empirical:{gpu}")
        assert model.buckets == {}
        np.testing.assert_allclose(model.cdf(grid, 3.0), load_lifetime_model(f"empirical:{gpu}").cdf(grid))


def test_measured_gpu_statistics_match_the_docs():
    obs = [o for o in read_lifetimes_file(LIFETIME_CSV).rows["lifetime_observations"] if o["server_type"] == "k80"]
    rows = time_of_day_stats([o["lifetime_s"] for o in obs], [clock_hour(o) for o in obs])
    assert [r["n"] for r in rows] == [0, 0, 31, 32]
    assert rows[2]["ks_p"] == pytest.approx(0.0964, abs=1e-3)
    assert rows[2]["revoked_before_24h"] == pytest.approx(0.323, abs=1e-3)
    assert rows[3]["mean_h"] == pytest.approx(21.21, abs=0.01)
