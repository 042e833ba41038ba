"""Where cmdare keeps its files: the measurement store, checkpoints and saved models.

``CMDARE_HOME`` overrides the data directory (default ``$XDG_DATA_HOME/cmdare`` or
``~/.local/share/cmdare``); ``CMDARE_DB_URL`` overrides the store with any SQLAlchemy URL.
``CMDARE_SCRATCH`` names a server's own scratch space (on a transient server: lost with it). The
directories cmdare creates are readable by their owner only (0700).
"""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> Path:
    """``path`` as a directory; created readable by its owner only (missing parents get the default mode)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """The user's cmdare data directory (created on first use)."""
    home = os.environ.get("CMDARE_HOME")
    if home:
        path = Path(home).expanduser()
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        path = Path(base) / "cmdare"
    return private_dir(path)


def default_db_url() -> str:
    """``CMDARE_DB_URL`` if set, else a SQLite file in :func:`data_dir`."""
    return os.environ.get("CMDARE_DB_URL") or f"sqlite:///{data_dir() / 'cmdare.db'}"


def checkpoint_root() -> Path:
    """Directory holding one sub-directory of checkpoints per run."""
    return private_dir(data_dir() / "checkpoints")


def models_dir() -> Path:
    """Directory holding fitted performance models."""
    return private_dir(data_dir() / "models")


def scratch_dir() -> Path:
    """This server's scratch directory: ``CMDARE_SCRATCH``, else the data directory's ``scratch``.

    On a transient server it lives on the server's own disk and ends with it: nothing that must
    survive a revocation belongs here (checkpoints go to :mod:`cmdare.storage`).
    """
    env = os.environ.get("CMDARE_SCRATCH")
    return private_dir(Path(env).expanduser() if env else data_dir() / "scratch")
