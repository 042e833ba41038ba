"""The public data ships inside the package: found without any folder beside the checkout, overridable,
licensed, small, and the compact preemption JSON reads exactly as the upstream records do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmdare.errors import DataNotFoundError
from cmdare.measure.importers.lifetimes import read_lifetimes_file
from cmdare.public_data import BUNDLED_DIR, is_bundled, lifetime_files, public_data_dir
from cmdare.public_data.compact import compact_preemptions, main

ORIGINAL_SAMPLE = Path(__file__).resolve().parents[1] / "measure" / "data" / "gce_cpu_preemptions_original_sample.json"


def test_bundled_by_default_from_any_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("CMDARE_SHARED_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    assert public_data_dir() == BUNDLED_DIR and is_bundled()
    assert (BUNDLED_DIR / "cmdare" / "speed_data" / "0latency_data.csv").is_file()
    assert all(p.is_file() for p in lifetime_files())


def test_override_and_bad_override(monkeypatch, tmp_path):
    monkeypatch.setenv("CMDARE_SHARED_DATA", str(BUNDLED_DIR))
    assert public_data_dir() == BUNDLED_DIR
    other = tmp_path / "data"
    (other / "cmdare").mkdir(parents=True)
    monkeypatch.setenv("CMDARE_SHARED_DATA", str(other))
    assert public_data_dir() == other and not is_bundled()
    assert lifetime_files()[0] == other / "lifetimes" / "gce_gpu_lifetimes.csv"
    monkeypatch.setenv("CMDARE_SHARED_DATA", str(tmp_path / "none"))
    with pytest.raises(DataNotFoundError, match="CMDARE_SHARED_DATA=.*no cmdare/ folder"):
        public_data_dir()


def test_licenses_credits_and_size():
    for folder in ("cmdare", "lifetimes"):
        assert "Apache License" in (BUNDLED_DIR / folder / "LICENSE").read_text()
    credits = (BUNDLED_DIR / "CREDITS.md").read_text()
    for source in ("cake-lab/CM-DARE", "cake-lab/transient-deep-learning", "kadupitiya/goog-preemption-data"):
        assert source in credits
    files = [p for p in BUNDLED_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) < 3_000_000  # a few MB at most in the wheel


def _rows(path: Path) -> list[dict]:
    return read_lifetimes_file(path).rows["lifetime_observations"]


def test_compact_json_reads_as_the_upstream_records(tmp_path):
    original = json.loads(ORIGINAL_SAMPLE.read_text())
    assert any("compute.instances.preempted" in vm for vm in original.values())  # the sample has every kind of VM
    assert any("stop" in vm and "compute.instances.preempted" not in vm for vm in original.values())
    compact = tmp_path / "compact.json"
    main([str(ORIGINAL_SAMPLE), str(compact)])
    assert compact.stat().st_size < ORIGINAL_SAMPLE.stat().st_size / 3
    assert _rows(compact) == _rows(ORIGINAL_SAMPLE) and len(_rows(compact)) == len(original)
    # the bundled file holds exactly the compact form of these upstream records
    bundled = json.loads(lifetime_files()[1].read_text())
    assert len(bundled) == 1442
    assert {name: bundled[name] for name in original} == compact_preemptions(original)
