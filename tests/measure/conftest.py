"""Fixtures of the measure tests: store URLs on SQLite and (when CMDARE_TEST_PG_URL is set) PostgreSQL.

Each test module gets its own fresh PostgreSQL database, dropped at the end, so modules never collide.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from measure_testdata import PG_URL
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


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
