"""Durable storage for what must outlive a transient server: checkpoints and a run's control files.

A :class:`Storage` is a local directory or any fsspec URL (``s3://``, ``gs://``, ...).
:func:`storage_root` picks the location: ``--storage``, else ``CMDARE_STORAGE``, else the data
directory's ``checkpoints/``; each run keeps its objects in ``ROOT/RUN``.
"""

from __future__ import annotations

import os

from cmdare.storage.location import MissingObjectError, Storage, storage_options

__all__ = ["MissingObjectError", "Storage", "as_storage", "run_storage", "storage_options", "storage_root"]


def as_storage(location: Storage | str | os.PathLike[str]) -> Storage:
    """``location`` as a :class:`Storage` (a path or URL is opened; a Storage is returned as is)."""
    return location if isinstance(location, Storage) else Storage(location)


def storage_root(uri: str | os.PathLike[str] | None = None) -> Storage:
    """The storage root: ``uri``, else ``CMDARE_STORAGE``, else the data directory's ``checkpoints/``."""
    if uri is None or not os.fspath(uri).strip():
        uri = os.environ.get("CMDARE_STORAGE") or None
    if uri is None:
        from cmdare.paths import checkpoint_root

        return Storage(checkpoint_root())
    return Storage(uri)


def run_storage(run_id: str, uri: str | os.PathLike[str] | None = None) -> Storage:
    """Where run ``run_id`` keeps its checkpoints and control files (``ROOT/RUN``)."""
    return storage_root(uri).child(run_id)
