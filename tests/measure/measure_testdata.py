"""Paths of the shared public data used by the measure tests (imported by name: unique module name)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
if not SHARED_DATA.exists():  # a checkout next to ../shared, or the path CI gives
    SHARED_DATA = Path(os.environ.get("CMDARE_SHARED_DATA", "/work/shared/data"))
CMDARE_DIR = SHARED_DATA / "cmdare"
LIFETIME_CSV = SHARED_DATA / "lifetimes" / "gce_gpu_lifetimes.csv"
LIFETIME_JSON = SHARED_DATA / "lifetimes" / "gce_cpu_preemptions.json"
PG_URL = os.environ.get("CMDARE_TEST_PG_URL")

needs_data = pytest.mark.skipif(not CMDARE_DIR.exists(), reason=f"shared data not found at {SHARED_DATA}")
