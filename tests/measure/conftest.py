"""Fixtures of the measure tests: store URLs on SQLite and (when CMDARE_TEST_PG_URL is set) PostgreSQL.

Each test module gets its own fresh PostgreSQL database, dropped at the end, so modules never collide.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
if not SHARED_DATA.exists():  # a checkout next to ../shared, or the path CI gives
    SHARED_DATA = Path(os.environ.get("CMDARE_SHARED_DATA", "/work/shared/data"))
CMDARE_DIR = SHARED_DATA / "cmdare"
LIFETIME_CSV = SHARED_DATA / "lifetimes" / "gce_gpu_lifetimes.csv"
LIFETIME_JSON = SHARED_DATA / "lifetimes" / "gce_cpu_preemptions.json"
PG_URL = os.environ.get("CMDARE_TEST_PG_URL")

needs_data = pytest.mark.skipif(not CMDARE_DIR.exists(), reason=f"shared data not found at {SHARED_DATA}")


def _pg_database(tag: str) -> Iterator[str]:
    assert PG_URL
    base = make_url(PG_URL)
    name = f"cmdare_t_{tag}_{uuid.uuid4().hex[:8]}".lower()
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(
                text(
                    f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
                    "AND pid <> pg_backend_pid()"
                )
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=[pytest.mark.postgres, pytest.mark.skipif(not PG_URL, reason="CMDARE_TEST_PG_URL is not set")],
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(request, tmp_path_factory) -> Iterator[str]:
    """A fresh, empty store URL per test module and backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'cmdare.db'}"
    else:
        yield from _pg_database(request.module.__name__.rsplit(".", 1)[-1][:20])


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty store URL per test and backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cmdare.db'}"
    else:
        yield from _pg_database(request.node.name[:12].strip("[]-_") or "t")
