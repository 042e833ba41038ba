"""Opening the store (engine, migrations) and the query helpers reports and importers use."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, func, insert, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from cmdare.errors import StoreError
from cmdare.measure.store.schema import Base

if TYPE_CHECKING:
    import pandas as pd

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000  # concurrent writers wait for the lock instead of failing
PG_CONNECT_TIMEOUT_S = 5


def _one_line(err: BaseException) -> str:
    orig = getattr(err, "orig", None) or err
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    return lines[0] if lines else type(orig).__name__


def _set_sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _make_engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError as err:
        raise StoreError(f"invalid store URL {url!r}: {_one_line(err)}") from err
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            path = Path(db).expanduser()
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():  # a new store is its owner's only (SQLite gives its journal the same mode)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    elif parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ImportError, ArgumentError) as err:
        raise StoreError(f"cannot use store URL {parsed.render_as_string()}: {_one_line(err)}") from err
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def _alembic_config():
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def _head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def _current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (no-op when it is already there)."""
    from alembic import command

    if _current_revision(engine) == _head_revision():
        return
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Store:
    """A migrated measurement store: an engine, a session factory and query helpers.

    Attributes:
        url: the SQLAlchemy URL (password hidden).
        engine: the SQLAlchemy engine.
        sessions: a :class:`sqlalchemy.orm.sessionmaker` bound to the engine.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.url = engine.url.render_as_string(hide_password=True)
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error."""
        try:
            with self.sessions.begin() as session:
                yield session
        except SQLAlchemyError as err:
            raise StoreError(f"store {self.url}: {_one_line(err)}") from err

    def insert_rows(self, table: str, rows: Sequence[dict[str, Any]], session: Session | None = None) -> int:
        """Insert many rows into ``table`` with one executemany; returns the number inserted."""
        if not rows:
            return 0
        tbl = Base.metadata.tables[table]
        if session is not None:
            session.execute(insert(tbl), list(rows))
        else:
            with self.session() as s:
                s.execute(insert(tbl), list(rows))
        return len(rows)

    def count(self, table: str) -> int:
        """Number of rows in ``table``."""
        tbl = Base.metadata.tables[table]
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(tbl)).scalar_one())

    def counts(self) -> dict[str, int]:
        """Row count of every table."""
        return {name: self.count(name) for name in Base.metadata.tables}

    def frame(self, table: str, where: Any = None, order_by: Sequence[str] = ()) -> pd.DataFrame:
        """Rows of ``table`` as a pandas DataFrame (optionally filtered and ordered)."""
        import pandas as pd

        tbl = Base.metadata.tables[table]
        stmt = select(tbl)
        if where is not None:
            stmt = stmt.where(where(tbl.c) if callable(where) else where)
        if order_by:
            stmt = stmt.order_by(*[tbl.c[c] for c in order_by])
        with self.engine.connect() as conn:
            result = conn.execute(stmt)
            return pd.DataFrame(result.fetchall(), columns=list(result.keys()))

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()


def open_store(url: str | None = None, migrate_schema: bool = True) -> Store:
    """Open (and create or migrate) the measurement store.

    Args:
        url: a SQLAlchemy URL; None means :func:`cmdare.paths.default_db_url` (``CMDARE_DB_URL`` or a
            SQLite file in the user's data directory).
        migrate_schema: run the Alembic migrations up to the newest revision.

    Returns:
        The open :class:`Store`.

    Raises:
        StoreError: the URL is invalid, its driver is missing or the database cannot be reached.
    """
    from cmdare.paths import default_db_url

    url = url or default_db_url()
    engine = _make_engine(url)
    shown = engine.url.render_as_string(hide_password=True)
    for attempt in range(3):
        try:
            if migrate_schema:
                migrate(engine)
            else:
                with engine.connect():
                    pass
            break
        except SQLAlchemyError as err:
            msg = _one_line(err)
            # Two processes creating a fresh SQLite file at once: retry once the other one is done.
            racing = "locked" in msg or "already exists" in msg
            if attempt < 2 and engine.dialect.name == "sqlite" and racing:
                time.sleep(0.5 + 0.5 * attempt)
                continue
            engine.dispose()
            raise StoreError(f"cannot open store {shown}: {msg}") from err
    return Store(engine)
