"""Lifetime models: registry, fit/cdf/sample, persistence, loading by spec, fit quality on real data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from measure_testdata import LIFETIME_CSV, LIFETIME_JSON

from cmdare.errors import DataFormatError, DataNotFoundError, UnknownNameError
from cmdare.measure.lifetime_models import (
    DEADLINE_S,
    LIFETIME_MODELS,
    BathtubLifetime,
    EmpiricalLifetime,
    ExponentialLifetime,
    empirical_cdf,
    ks_distance,
    load_lifetime_model,
    make_lifetime_model,
    model_from_dict,
)


@pytest.fixture(scope="module")
def cpu_lifetimes():
    data = json.loads(LIFETIME_JSON.read_text())
    t = np.array([v["time_in_sec"] for v in data.values()])
    censored = np.array(["compute.instances.preempted" not in v for v in data.values()])
    assert len(t) == 1442
    return t, censored


def test_registry_and_unknown_name():
    assert set(LIFETIME_MODELS) == {"exponential", "bathtub", "empirical"}
    with pytest.raises(UnknownNameError, match="valid: exponential, bathtub, empirical"):
        make_lifetime_model("weibull")
    with pytest.raises(UnknownNameError, match="lifetime model"):
        load_lifetime_model("weibull:k80")
    with pytest.raises(UnknownNameError, match="k80"):
        load_lifetime_model("bathtub:a100")


def test_exponential_mle_with_censoring():
    rng = np.random.default_rng(0)
    t = rng.exponential(3600.0, 20_000)
    m = ExponentialLifetime().fit(t)
    assert m.mean_s_ == pytest.approx(3600, rel=0.03)
    cut = np.minimum(t, 3000.0)  # right-censor at 3000 s: the MLE still recovers the mean
    m2 = ExponentialLifetime().fit(cut, censored=t > 3000.0)
    assert m2.mean_s_ == pytest.approx(3600, rel=0.05)
    assert ks_distance(m, t) < 0.02


def test_bathtub_recovers_synthetic_parameters():
    truth = BathtubLifetime(A=0.4, tau1_s=1800.0, tau2_s=900.0, b_s=DEADLINE_S + 600, max_s=DEADLINE_S + 3600)
    t = truth.sample(np.random.default_rng(1), 5000)
    assert t.max() <= DEADLINE_S + 3600 and t.min() >= 0
    fit = BathtubLifetime().fit(t)
    assert ks_distance(fit, t) < 0.03
    assert pytest.approx(0.4, abs=0.05) == fit.A_
    assert fit.tau1_s_ == pytest.approx(1800, rel=0.3)


def test_bathtub_on_1442_vm_json_beats_exponential(cpu_lifetimes):
    t, _ = cpu_lifetimes
    bath = BathtubLifetime().fit(t)
    exp = ExponentialLifetime().fit(t)
    ks_b, ks_e = ks_distance(bath, t), ks_distance(exp, t)
    assert ks_b < ks_e / 3
    assert ks_b < 0.085  # measured 0.079 (see docs/reports.md)
    assert 0.55 < bath.A_ < 0.75 and DEADLINE_S <= bath.b_s_ <= DEADLINE_S + 3600


@pytest.mark.xfail(
    strict=True,
    reason="target missed: the 4-parameter bathtub reaches KS 0.079 on the 1,442 "
    "VMs (its flat middle cannot follow the slow rise from 4 h to 23 h); see docs/reports.md",
)
def test_bathtub_on_1442_vm_json_within_ks_005(cpu_lifetimes):
    t, _ = cpu_lifetimes
    assert ks_distance(BathtubLifetime().fit(t), t) <= 0.05


def test_empirical_is_exact_and_km_handles_censoring(cpu_lifetimes):
    t, cens = cpu_lifetimes
    emp = EmpiricalLifetime().fit(t)
    assert ks_distance(emp, t) < 0.002
    x, f = empirical_cdf(t, cens)
    assert np.all(np.diff(f) >= 0) and f[-1] == pytest.approx(1.0)
    # Censoring removes stopped VMs from the revoked count: fewer revocations by 1 h.
    assert np.interp(3600, x, f) < np.mean(t <= 3600)


@pytest.mark.parametrize("name", ["exponential", "bathtub", "empirical"])
def test_roundtrip_and_sampling(name, tmp_path):
    rng = np.random.default_rng(2)
    data = np.concatenate([rng.exponential(2000, 300), rng.uniform(DEADLINE_S - 100, DEADLINE_S + 900, 200)])
    model = make_lifetime_model(name).fit(data)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(model.to_dict()))
    again = load_lifetime_model(str(path))
    grid = np.linspace(0, DEADLINE_S + 2000, 50)
    np.testing.assert_allclose(again.cdf(grid), model.cdf(grid))
    s1 = again.sample(np.random.default_rng(5), 2000)
    s2 = model.sample(np.random.default_rng(5), 2000)
    np.testing.assert_allclose(s1, s2)
    assert s1.shape == (2000,) and np.all(s1 >= 0)
    assert again.sample(np.random.default_rng(0), (3, 4)).shape == (3, 4)
    assert np.all(np.diff(model.cdf(grid)) >= -1e-12)
    assert model_from_dict(model.to_dict()).name == name


@pytest.mark.parametrize("spec", ["bathtub", "bathtub:k80", "exponential:cpu", "empirical:p100", "bathtub:V100"])
def test_shipped_defaults_sample_sensible_lifetimes(spec):
    model = load_lifetime_model(spec)
    x = model.sample(np.random.default_rng(0), 5000)
    assert np.all(x >= 0)
    if not spec.startswith("exponential"):
        assert x.max() < 26 * 3600  # GCE preemptible VMs live at most ~24 h
    assert 0 <= model.cdf(np.array([3600.0]))[0] <= 1


def test_load_from_lifetime_csv(tmp_path):
    model = load_lifetime_model(str(LIFETIME_CSV))
    assert isinstance(model, EmpiricalLifetime) and model.meta["n"] > 500
    plain = tmp_path / "l.csv"
    plain.write_text("lifetime_s\n100\n200\n300\n")
    m = load_lifetime_model(str(plain))
    assert set(m.sample(np.random.default_rng(0), 100)) <= {100.0, 200.0, 300.0}


def test_bad_model_files(tmp_path):
    with pytest.raises(DataNotFoundError):
        load_lifetime_model(str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "bathtub", "params": {"A": 0.5,')
    with pytest.raises(DataFormatError, match="not valid JSON"):
        load_lifetime_model(str(bad))
    bad.write_text('{"params": {}}')
    with pytest.raises(DataFormatError):
        load_lifetime_model(str(bad))
