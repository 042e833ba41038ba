"""Lifetime models per cloud, market and GPU, from the catalog's markets and interruption rates."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.catalog import load_catalog
from cmdare.cloud.catalog_model import RATE_BANDS, parse_interruption_rate
from cmdare.cloud.servers import ServerSpec
from cmdare.errors import UserInputError
from cmdare.measure.lifetime_markets import SpotLifetime, market_lifetime, market_rows, offering_draw
from cmdare.measure.lifetime_models import load_lifetime_model

MONTH = 30 * 86400.0


def test_rates_and_bands():
    assert parse_interruption_rate("8%/month") == (0.08, MONTH)
    assert parse_interruption_rate("8%") == (0.08, MONTH)
    assert parse_interruption_rate("2%/day") == (0.02, 86400.0)
    assert parse_interruption_rate(" 0.5 % / h") == (0.005, 3600.0)
    assert parse_interruption_rate("5-10%") == (0.075, MONTH) and parse_interruption_rate(">20%") == (0.25, MONTH)
    assert set(RATE_BANDS) == {"<5%", "5-10%", "10-15%", "15-20%", ">20%"}
    for bad in ("fast", "120%/month", "0%", "8%/fortnight"):
        with pytest.raises(UserInputError):
            parse_interruption_rate(bad)


def test_spot_model_matches_its_rate_and_has_no_deadline():
    exp = SpotLifetime.from_rate(0.075, MONTH)
    assert exp.name == "exponential" and exp.cdf(MONTH) == pytest.approx(0.075)
    assert exp.mean_s() == pytest.approx(MONTH / -np.log(0.925))
    wb = SpotLifetime.from_rate(0.3, 86400.0, shape=0.7)
    assert wb.name == "weibull" and wb.cdf(86400.0) == pytest.approx(0.3)
    draws = wb.sample(np.random.default_rng(0), 200_000)
    assert np.mean(draws <= 86400.0) == pytest.approx(0.3, abs=0.005) and draws.max() > 10 * 86400.0
    # the censored maximum-likelihood fit recovers a known Weibull (servers still alive at 2 days censored)
    truth = SpotLifetime(0.7, 40_000.0).sample(np.random.default_rng(1), 5000)
    observed, censored = np.minimum(truth, 2 * 86400.0), truth > 2 * 86400.0
    fit = SpotLifetime().fit(observed, censored)
    assert fit.shape_ == pytest.approx(0.7, rel=0.06) and fit.scale_s_ == pytest.approx(40_000.0, rel=0.08)


def test_every_offering_names_market_and_lifetime_model():
    catalog = load_catalog()
    for o in catalog.offerings:
        assert o.market in ("preemptible", "spot", "on-demand") and o.lifetime
        if o.market == "spot":
            assert o.interruption_rate and o.interruption_source and o.interruption_as_of
        assert (o.market == "on-demand") == (o.spot_usd_per_h is None)
    markets = {(o.cloud, o.market) for o in catalog.offerings}
    assert {("gcp", "preemptible"), ("gcp", "spot"), ("aws", "spot"), ("aws", "on-demand")} <= markets


def test_market_lifetimes_per_cloud_and_gpu():
    catalog = load_catalog()
    k80 = market_lifetime(catalog, "gcp", "k80", "us-east1")
    assert k80.spec == "bathtub:k80" and not k80.assumption and "measured GCE preemptible" in k80.basis
    assert k80.model.to_dict() == load_lifetime_model("bathtub:k80").to_dict()  # today's fitted model, kept
    t4 = market_lifetime(catalog, "gcp", "t4", "us-east1")
    assert t4.market == "spot" and t4.assumption and t4.label.startswith("exponential 12%/month")
    aws = market_lifetime(catalog, "aws", "v100", "us-east-1")  # fitted from the bundled p3 trace (issue 32)
    assert aws.market == "spot" and aws.label == "weibull fitted (aws:v100)" and not aws.assumption
    assert "bamboo_p3-trace.csv" in aws.basis and aws.model.mean_s() / 3600 == pytest.approx(1.62, abs=0.05)
    l4 = market_lifetime(catalog, "aws", "l4", "us-east-1")  # no trace: the catalog's band, an assumption
    assert "band" in l4.label and l4.assumption
    override = market_lifetime(catalog, "aws", "v100", "us-east-1", rate="2%/day")
    assert override.model.cdf(86400.0) == pytest.approx(0.02) and "--interruption-rate" in override.basis
    assert market_lifetime(catalog, "aws", "cpu", "us-east-1").model is None  # PS servers: on-demand only
    assert market_lifetime(catalog, "gcp", "v100", "us-east1", transient=False).market == "on-demand"


def test_market_rows_name_data_or_assumption():
    rows = market_rows(load_catalog())
    by = {(r["cloud"], r["market"], r["model"]): r for r in rows}
    k80 = by[("gcp", "preemptible", "bathtub:k80")]
    assert k80["deadline_h"] == 24.0 and k80["revoked_by_30d"] == 1.0 and "63 measured" in k80["basis"]
    spot = [r for r in rows if r["market"] == "spot"]
    assert spot and all(r["deadline_h"] is None for r in spot)
    assert all("assumption" in r["basis"] and r["revoked_by_24h"] < 0.01 for r in spot if r["assumption"])
    # the bundled traces' offerings (issue 32): fitted, with source and date, and far shorter lives
    fitted = {(r["cloud"], r["servers"]): r for r in spot if r["basis"].startswith("fitted (")}
    assert set(fitted) == {("aws", "v100"), ("aws", "t4"), ("gcp", "a100")}, sorted(fitted)
    assert all(not r["assumption"] and "bundled trace" in r["basis"] and r["revoked_by_24h"] > 0.5
               for r in fitted.values())


def test_emulation_draws_from_each_servers_offering():
    rng = np.random.default_rng(0)
    draw = offering_draw(rng, load_catalog())

    class W:
        def __init__(self, cloud, gpu, region):
            self.server = ServerSpec(gpu, cloud, region, True, 0.2)

    gce = [draw(W("gcp", "K80", "us-east1")) for _ in range(300)]
    aws = [draw(W("aws", "V100", "us-east-1")) for _ in range(300)]
    l4 = [draw(W("aws", "L4", "us-east-1")) for _ in range(300)]
    assert max(gce) <= load_lifetime_model("bathtub:k80").params()["max_s"]  # the 24 h deadline (+ slack)
    assert np.median(l4) > 30 * 86400.0  # no deadline; an assumed rate: the median is months
    assert 0.8 * 3600 < np.median(aws) < 2 * 3600  # the p3 trace's Weibull (scale 1.68 h, shape 1.09)
