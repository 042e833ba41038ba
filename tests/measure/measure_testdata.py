"""Paths of the public data used by the measure tests (imported by name: unique module name).

The data is the copy bundled in the package (``cmdare.public_data``): the CM-DARE CSVs and the GPU
lifetime sheet as upstream, the preemption JSON in its compact form. ``data/`` beside this file
keeps a slice of the original preemption JSON, so the importer is also tested on upstream records.
"""

from __future__ import annotations

import os
from pathlib import Path

from cmdare.public_data import BUNDLED_DIR

PUBLIC_DATA = BUNDLED_DIR
CMDARE_DIR = PUBLIC_DATA / "cmdare"
LIFETIME_CSV = PUBLIC_DATA / "lifetimes" / "gce_gpu_lifetimes.csv"
LIFETIME_JSON = PUBLIC_DATA / "lifetimes" / "gce_cpu_preemptions.json"
ORIGINAL_JSON_SAMPLE = Path(__file__).resolve().parent / "data" / "gce_cpu_preemptions_original_sample.json"
PG_URL = os.environ.get("CMDARE_TEST_PG_URL")
