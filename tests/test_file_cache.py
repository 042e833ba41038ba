"""The on-disk JSON cache shared by workload profiles and lifetime fits."""

from __future__ import annotations

import numpy as np

from cmdare.file_cache import cached_json, code_digest
from cmdare.measure.lifetime_models import BathtubLifetime
from cmdare.measure.reports.lifetimes import fit_models


def test_a_value_is_computed_once_and_a_corrupt_file_is_computed_again(tmp_path):
    path, calls = tmp_path / "c.json", []

    def compute() -> int:
        calls.append(1)
        return 41 + len(calls)

    assert cached_json(path, "k", compute, str, int) == 42
    assert cached_json(path, "k", compute, str, int) == 42 and len(calls) == 1
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("{not json")
    assert cached_json(path, "k", compute, str, int) == 43 and len(calls) == 2


def test_code_digest_changes_with_the_code(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = 1\n")
    before = code_digest([f])
    f.write_text("a = 2\n")
    assert code_digest([f]) != before and len(before) == 16


def test_a_cached_bathtub_fit_equals_a_fresh_one(tmp_path, monkeypatch):
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path))
    rng = np.random.default_rng(0)
    t = np.concatenate([rng.exponential(3 * 3600, 60), np.full(40, 24 * 3600.0)])
    cens = np.zeros(t.size, bool)
    first = fit_models(t, cens)["bathtub"]
    assert list((tmp_path / "models" / "lifetime_fits").glob("bathtub-*.json"))
    again = fit_models(t, cens)["bathtub"]
    fresh = BathtubLifetime().fit(t, cens)
    assert first.params() == again.params() == fresh.params()  # exact: a JSON round trip of floats
