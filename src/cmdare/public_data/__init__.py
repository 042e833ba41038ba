"""The public measurements cmdare's models, planner, lifetime models and reports are built on.

They ship inside the package (see ``CREDITS.md`` beside this file for sources and licenses)::

    public_data_dir()/cmdare/      CM-DARE's processed measurements (ICDCS 2020), files as upstream
    public_data_dir()/lifetimes/   GCE GPU lifetimes (ICAC 2019) and CPU preemptions (HPDC 2020)

``CMDARE_SHARED_DATA`` may name another folder of the same layout (e.g. a newer upstream copy);
it is an override, never a requirement.
"""

from __future__ import annotations

import os
from pathlib import Path

from cmdare.errors import DataNotFoundError

__all__ = [
    "BUNDLED_DIR",
    "DATA_ENV",
    "LIFETIME_FILES",
    "PUBLIC_SOURCES",
    "is_bundled",
    "lifetime_files",
    "public_data_dir",
]

BUNDLED_DIR = Path(__file__).resolve().parent
DATA_ENV = "CMDARE_SHARED_DATA"
LIFETIME_FILES = ("gce_gpu_lifetimes.csv", "gce_cpu_preemptions.json")
PUBLIC_SOURCES = "CM-DARE (ICDCS 2020), ICAC 2019 GPU lifetimes, HPDC 2020 GCE preemptions"


def public_data_dir() -> Path:
    """The folder holding ``cmdare/`` and ``lifetimes/``: ``$CMDARE_SHARED_DATA`` if set, else the bundled copy.

    Raises:
        DataNotFoundError: ``CMDARE_SHARED_DATA`` names a folder without a ``cmdare/`` subfolder.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env).expanduser()
        if (path / "cmdare").is_dir():
            return path
        raise DataNotFoundError(f"{DATA_ENV}={env} has no cmdare/ folder of CM-DARE measurements")
    return BUNDLED_DIR


def is_bundled() -> bool:
    """Whether :func:`public_data_dir` is the copy shipped in the package (no override)."""
    return public_data_dir() == BUNDLED_DIR


def lifetime_files() -> list[Path]:
    """The two public lifetime files (GPU lifetime sheet, CPU preemption JSON)."""
    root = public_data_dir() / "lifetimes"
    return [root / name for name in LIFETIME_FILES]
