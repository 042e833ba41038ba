"""Alembic environment of the measurement store.

cmdare runs migrations programmatically (:func:`cmdare.measure.store.open_store`), passing an open
connection in ``config.attributes["connection"]``; the ``sqlalchemy.url`` option is the fallback for
running ``alembic`` by hand.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from cmdare.measure.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        _run(conn)
