"""The measurement store: schema, migrations and the :class:`Store` handle.

``open_store(url)`` creates or migrates the schema with Alembic and returns a :class:`Store`.
SQLite (default, WAL mode with a busy timeout so concurrent writers queue instead of failing) and
PostgreSQL (``CMDARE_DB_URL=postgresql+psycopg2://...``) are supported.
"""

from cmdare.measure.store.repository import Store, migrate, open_store

__all__ = ["Store", "migrate", "open_store"]
