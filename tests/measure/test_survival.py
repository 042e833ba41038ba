"""Survival fits of spot lifetimes: Kaplan-Meier by hand, censored MLEs, left truncation, selection by
held-out likelihood on known data and the held-out check on a bundled trace."""

from __future__ import annotations

import json
import math
from datetime import date

import numpy as np
import pytest

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.measure.lifetime_markets import SpotLifetime
from cmdare.measure.lifetime_models import ExponentialLifetime
from cmdare.measure.spot_traces import ServerSpans, load_bundled_trace
from cmdare.measure.survival import (
    fit_model,
    fit_weibull,
    heldout_check,
    kaplan_meier,
    log_likelihood,
    select_by_heldout,
    spans_log_likelihood,
)

HOUR, MONTH = 3600.0, 30 * 86400.0


def _synthetic(model, n=2000, horizon_s=48 * HOUR, seed=0) -> ServerSpans:
    """Servers arriving uniformly over the horizon, lifetimes from ``model``, censored at the horizon."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(0.0, horizon_s, n)
    end = start + model.sample(rng, n)
    return ServerSpans.from_arrays(start, np.minimum(end, horizon_s), end > horizon_s, horizon_s, "synthetic")


def test_kaplan_meier_by_hand():
    # 1 (event), 2 (censored), 2, 3, 4 (censored), 5: at risk 6, 5, 3, 2, 1
    t, s = kaplan_meier([1, 2, 2, 3, 4, 5], [False, True, False, False, True, False])
    assert t.tolist() == [1, 2, 3, 4, 5]
    assert s == pytest.approx([5 / 6, 5 / 6 * 4 / 5, 2 / 3 * 2 / 3, 4 / 9, 0.0])


def test_exponential_mle_is_exposure_over_events():
    s = load_bundled_trace("aws:v100").spans
    t, cens = s.lifetimes()
    model = fit_model("exponential", t, cens)
    assert model.mean_s_ == pytest.approx(s.exposure_s() / s.preemptions())
    assert model.mean_s_ / HOUR == pytest.approx(273.1167 / 167, rel=1e-5)
    ll = log_likelihood(model, t, cens)
    assert ll == pytest.approx(-167 * math.log(model.mean_s_) - t.sum() / model.mean_s_)
    for factor in (0.99, 1.01):  # it is the maximum
        assert log_likelihood(ExponentialLifetime(model.mean_s_ * factor), t, cens) < ll
    with pytest.raises(UnknownNameError):
        fit_model("gamma", t, cens)


def test_weibull_mle_recovers_shape_and_scale():
    draws = SpotLifetime(0.5, 10_000.0).sample(np.random.default_rng(0), 5000)
    cens = draws > 100_000.0  # about 4% still alive at the end of observation
    fit = fit_weibull(np.minimum(draws, 100_000.0), cens)
    assert fit.shape_ == pytest.approx(0.5, rel=0.03) and fit.scale_s_ == pytest.approx(10_000.0, rel=0.05)


def test_left_truncation_of_an_exponential_counts_only_the_observed_time():
    s = load_bundled_trace("aws:v100").spans
    _, second = s.split(20_000.0)
    model = ExponentialLifetime(5000.0)
    expected = -second.preemptions() * math.log(5000.0) - second.exposure_s() / 5000.0  # memoryless
    assert spans_log_likelihood(model, second) == pytest.approx(expected)


def test_selection_prefers_weibull_on_weibull_data():
    spans = _synthetic(SpotLifetime(0.5, 4 * HOUR))
    result = select_by_heldout(spans, fitted_on=date(2025, 1, 2))
    ll = result.heldout_loglik
    assert result.chosen == "weibull" and ll["weibull"] > ll["exponential"] + 0.3
    assert "bathtub" in ll and ll["bathtub"] < ll["weibull"]  # lifetimes pass 23 h: fitted, then rejected
    assert result.model.shape_ == pytest.approx(0.5, rel=0.1) and result.model.scale_s_ == pytest.approx(
        4 * HOUR, rel=0.1)
    record = json.loads(json.dumps(result.to_dict()))
    assert record["fitted_on"] == "2025-01-02" and record["model"]["model"] == "weibull"
    assert record["preemptions"] == spans.preemptions() and record["servers"] == 2000


def test_exponential_is_not_worse_on_exponential_data():
    spans = _synthetic(SpotLifetime(1.0, 4 * HOUR))
    result = select_by_heldout(spans, candidates=("exponential", "weibull"))
    ll = result.heldout_loglik
    assert ll["exponential"] >= ll["weibull"] - 0.01
    check = heldout_check(spans, result.first_half_model, SpotLifetime.from_rate(0.075, MONTH))
    assert abs(check["fitted_z"]) < 3 and check["assumption_z"] > 100  # 7.5%/month is far too rare here
    # an exponential's expected preemptions are the exposure over its mean
    _, second = spans.split(spans.horizon_s / 2)
    fixed = heldout_check(spans, ExponentialLifetime(4 * HOUR), ExponentialLifetime(8 * HOUR))
    assert fixed["fitted_expected"] == pytest.approx(second.exposure_s() / (4 * HOUR))
    assert fixed["assumption_per_server_hour"] == pytest.approx(1 / 8)
    assert fixed["observed"] == second.preemptions()


def test_selection_on_a_bundled_trace():
    spans = load_bundled_trace("aws:v100").spans
    result = select_by_heldout(spans, fitted_on="2025-01-02")
    assert set(result.heldout_loglik) == {"exponential", "weibull"} and "24 h" in result.skipped["bathtub"]
    assert result.n_servers == 177 and result.n_preemptions == 167
    assert result.heldout_preemptions == spans.split(result.split_at_s)[1].preemptions()
    check = heldout_check(spans, result.first_half_model, SpotLifetime.from_rate(0.075, MONTH))
    assert check["observed_per_server_hour"] == pytest.approx(check["observed"] / check["server_hours"])
    json.dumps(check)
    with pytest.raises(UserInputError):  # a second half is truncated: not a whole trace
        select_by_heldout(spans.split(20_000.0)[1])
