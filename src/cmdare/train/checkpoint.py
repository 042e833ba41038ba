"""Checkpoints in a :class:`~cmdare.storage.Storage`: data first, a SHA-256 manifest last, verified on load.

Layout of a run's storage location (a directory or an object-store prefix)::

    ckpt-000000200-3f9a1c.npz   parameters and momentum in model order, buffers, metadata
    ckpt-000000200.json         manifest: data object name, size, sha256, step (written after the data)

A checkpoint counts only once its manifest exists: an upload cut off mid-way leaves the previous
checkpoint as the latest, intact. Each upload writes a data object of its own name, so rewriting
the checkpoint of a step never changes the bytes an existing manifest vouches for; the manifest's
replacement is the switch. Rotation keeps the newest ``keep`` manifests and deletes every data object
none of them names. Parameters are stored in model order, so a run can resume with another placement.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cmdare.errors import CheckpointError
from cmdare.storage import MissingObjectError, Storage, as_storage

_PREFIX = "ckpt-"
_STEP_DIGITS = 9

__all__ = ["Checkpoint", "CheckpointStore", "SavedCheckpoint", "decode_checkpoint", "encode_checkpoint",
           "latest_checkpoint", "load_checkpoint", "save_checkpoint"]


@dataclass(frozen=True)
class Checkpoint:
    """Everything needed to resume: global step, parameters and momentum (model order), buffers."""

    step: int
    params: np.ndarray
    momentum: np.ndarray
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint as stored: its step, data object name and location, size in bytes."""

    step: int
    name: str
    url: str
    size_bytes: int


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    """The checkpoint's bytes (an ``.npz`` archive)."""
    arrays = {"params": ckpt.params, "momentum": ckpt.momentum}
    arrays.update({f"buffer::{k}": v for k, v in ckpt.buffers.items()})
    meta = dict(ckpt.meta, step=ckpt.step, saved_at=time.time())
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_checkpoint(data: bytes) -> Checkpoint:
    """The checkpoint in ``data`` (bytes from :func:`encode_checkpoint`)."""
    with np.load(io.BytesIO(data)) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        buffers = {k.split("::", 1)[1]: z[k] for k in z.files if k.startswith("buffer::")}
        return Checkpoint(int(meta["step"]), z["params"], z["momentum"], buffers, meta)


def _manifest_name(step: int) -> str:
    return f"{_PREFIX}{step:0{_STEP_DIGITS}d}.json"


class CheckpointStore:
    """A run's checkpoints in ``storage``, newest ``keep`` kept."""

    def __init__(self, storage: Storage, keep: int = 3):
        self.storage, self.keep = storage, max(1, keep)

    def save(self, ckpt: Checkpoint) -> SavedCheckpoint:
        """Write the data, then the manifest; then rotate. Returns what was stored."""
        data = encode_checkpoint(ckpt)
        name = f"{_PREFIX}{ckpt.step:0{_STEP_DIGITS}d}-{secrets.token_hex(3)}.npz"
        self.storage.put(name, data)
        manifest = {"file": name, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                    "step": ckpt.step}
        self.storage.put(_manifest_name(ckpt.step), json.dumps(manifest).encode())
        self.prune()
        return SavedCheckpoint(ckpt.step, name, self.storage.url(name), len(data))

    def manifests(self) -> list[str]:
        """Manifest names, oldest first."""
        return self.storage.names(_PREFIX, ".json")

    def latest(self) -> str | None:
        """The newest manifest's name, or None when the run has no checkpoint."""
        names = self.manifests()
        return names[-1] if names else None

    def manifest(self, name: str) -> dict[str, Any]:
        """Manifest ``name`` (``ckpt-STEP.json``), parsed."""
        where = self.storage.url(name)
        try:
            manifest = json.loads(self.storage.get(name))
            if not isinstance(manifest, dict) or not {"file", "size_bytes", "sha256", "step"} <= manifest.keys():
                raise ValueError
        except MissingObjectError:
            raise CheckpointError(f"checkpoint {where} is missing") from None
        except ValueError:
            raise CheckpointError(f"checkpoint manifest {where} is unreadable") from None
        return manifest

    def data_url(self, manifest_name: str) -> str:
        """Where the data of manifest ``manifest_name`` lives."""
        return self.storage.url(str(self.manifest(manifest_name)["file"]))

    def load(self, name: str | None = None) -> Checkpoint:
        """Load and verify checkpoint ``name`` (a manifest or data object name; default: the latest)."""
        name = name or self.latest()
        if name is None:
            raise CheckpointError(f"no checkpoint in {self.storage.uri}")
        if name.endswith(".npz"):
            name = name[: len(_PREFIX) + _STEP_DIGITS] + ".json"
        manifest = self.manifest(name)
        try:
            data = self.storage.get(str(manifest["file"]))
        except MissingObjectError as err:
            raise CheckpointError(f"checkpoint {self.storage.url(name)} is missing its data ({err})") from None
        if len(data) != manifest["size_bytes"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise CheckpointError(f"checkpoint {manifest['file']} in {self.storage.uri} is corrupt: checksum mismatch")
        try:
            return decode_checkpoint(data)
        except (ValueError, KeyError, OSError) as err:
            raise CheckpointError(f"checkpoint {manifest['file']} in {self.storage.uri} is unreadable: {err}") from None

    def prune(self) -> None:
        """Keep the newest ``keep`` manifests; delete every data object none of them names."""
        manifests = self.manifests()
        for old in manifests[: max(0, len(manifests) - self.keep)]:
            self.storage.delete(old)  # the manifest first: a half-deleted checkpoint never looks valid
        kept = set()
        for name in manifests[-self.keep:]:
            try:
                kept.add(str(self.manifest(name)["file"]))
            except CheckpointError:
                continue  # unreadable: its data cannot be told apart; left for the user to look at
        for data in self.storage.names(_PREFIX, ".npz"):
            if data not in kept:
                self.storage.delete(data)


def _located(storage: Storage, name: str) -> Path | str:
    """A local checkpoint as a Path, a remote one as its URL."""
    return storage.path / name if storage.path is not None else storage.url(name)


def save_checkpoint(location: Storage | str | os.PathLike[str], ckpt: Checkpoint,
                    keep: int = 3) -> tuple[Path | str, int]:
    """Store ``ckpt`` in ``location``; keep the newest ``keep``. Returns (data path or URL, bytes)."""
    storage = as_storage(location)
    saved = CheckpointStore(storage, keep).save(ckpt)
    return _located(storage, saved.name), saved.size_bytes


def load_checkpoint(path: Storage | str | os.PathLike[str]) -> Checkpoint:
    """Load and verify a checkpoint: the path or URL of its data or manifest, or a location (its latest)."""
    if isinstance(path, Storage):
        return CheckpointStore(path).load()
    text = os.fspath(path).rstrip("/")
    parent, _, name = text.rpartition("/")
    if name.startswith(_PREFIX) and name.endswith((".npz", ".json")):
        return CheckpointStore(Storage(parent or ".")).load(name)
    return CheckpointStore(Storage(text)).load()


def latest_checkpoint(location: Storage | str | os.PathLike[str]) -> Path | str | None:
    """The newest checkpoint's data (a Path for a local directory, else a URL), or None."""
    storage = as_storage(location)
    store = CheckpointStore(storage)
    name = store.latest()
    if name is None:
        return None
    try:
        return _located(storage, str(store.manifest(name)["file"]))
    except CheckpointError:
        return _located(storage, name)  # unreadable manifest: loading it says why
