"""Checkpoints in a :class:`~cmdare.storage.Storage`: data first, a SHA-256 manifest last, verified on load.

Layout of a run's storage location (a directory or an object-store prefix)::

    ckpt-000000200-3f9a1c.npz   parameters and momentum in model order, buffers, metadata
    ckpt-000000200.json         manifest: data object name, size, sha256, step (written after the data)

A checkpoint counts only once its manifest exists: an upload cut off mid-way leaves the previous
checkpoint as the latest, intact. Each upload writes a data object of its own name, so rewriting
the checkpoint of a step never changes the bytes an existing manifest vouches for; the manifest's
replacement is the switch. A manifest names only a data object of its own run and step. Rotation keeps
the newest ``keep`` manifests and deletes only data that none of them names and that is older than every
one of them (or whose step's manifest names another object): data newer than the newest manifest (an
upload cut off, or a manifest deleted) stays, and resuming past it is an explicit choice
(:meth:`CheckpointStore.resume_point`). Parameters are stored in model order, so a run can resume with
another placement.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
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
_DATA_NAME = re.compile(rf"^{_PREFIX}(\d{{{_STEP_DIGITS}}})-[0-9a-f]+\.npz$")
_MANIFEST_NAME = re.compile(rf"^{_PREFIX}(\d{{{_STEP_DIGITS}}})\.json$")

__all__ = ["Checkpoint", "CheckpointStore", "SavedCheckpoint", "decode_checkpoint", "encode_checkpoint",
           "is_finite", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]


@dataclass(frozen=True)
class Checkpoint:
    """Everything needed to resume: global step, parameters and momentum (model order), buffers, and the state of
    an optimizer other than SGD with momentum (an all-reduce run's AdamW: each state tensor flat in model order,
    each per-parameter scalar one value per parameter; :mod:`cmdare.train.allreduce.optimizer_state`)."""

    step: int
    params: np.ndarray
    momentum: np.ndarray
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)


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
    arrays.update({f"optimizer::{k}": v for k, v in ckpt.optimizer.items()})
    meta = dict(ckpt.meta, step=ckpt.step, saved_at=time.time())
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_checkpoint(data: bytes) -> Checkpoint:
    """The checkpoint in ``data`` (bytes from :func:`encode_checkpoint`).

    Raises:
        ValueError: not a checkpoint, or one whose parameters and momentum differ in shape or hold
            non-finite values (a run that diverged must not be resumed as if it had not).
    """
    with np.load(io.BytesIO(data)) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        buffers = {k.split("::", 1)[1]: z[k] for k in z.files if k.startswith("buffer::")}
        optimizer = {k.split("::", 1)[1]: z[k] for k in z.files if k.startswith("optimizer::")}
        ckpt = Checkpoint(int(meta["step"]), z["params"], z["momentum"], buffers, meta, optimizer)
    if ckpt.params.ndim != 1 or ckpt.momentum.shape != ckpt.params.shape:
        raise ValueError(f"{ckpt.params.size} parameters but {ckpt.momentum.size} momentum values")
    if not is_finite(ckpt):
        raise ValueError("its parameters, momentum or batch-norm statistics hold non-finite values (NaN or inf)")
    return ckpt


def is_finite(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint's parameters, momentum and floating-point buffers are all finite."""
    arrays = [ckpt.params, ckpt.momentum, *(np.asarray(b) for b in (ckpt.buffers or {}).values()),
              *(np.asarray(a) for a in (ckpt.optimizer or {}).values())]
    return all(np.isfinite(a).all() for a in arrays if a.dtype.kind in "fc")


def _manifest_name(step: int) -> str:
    return f"{_PREFIX}{step:0{_STEP_DIGITS}d}.json"


def _step_of(name: str) -> int:
    """The step in a checkpoint object's name (``ckpt-000000200-3f9a1c.npz`` -> 200)."""
    return int(name[len(_PREFIX):len(_PREFIX) + _STEP_DIGITS])


class CheckpointStore:
    """A run's checkpoints in ``storage``, newest ``keep`` kept."""

    def __init__(self, storage: Storage, keep: int = 3):
        self.storage, self.keep = storage, max(1, keep)

    def save(self, ckpt: Checkpoint) -> SavedCheckpoint:
        """Write the data, then the manifest; then rotate. Returns what was stored. A checkpoint holding NaN or
        infinite values is refused (:class:`CheckpointError`): it would rotate the good ones out."""
        if not is_finite(ckpt):
            raise CheckpointError(f"the checkpoint of step {ckpt.step} holds non-finite values (training "
                                  "diverged): not stored")
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

    def steps(self) -> list[int]:
        """The steps that have a manifest, oldest first."""
        return [_step_of(n) for n in self.manifests() if _MANIFEST_NAME.match(n)]

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
        file, step = manifest["file"], manifest["step"]
        if (not isinstance(file, str) or not _DATA_NAME.match(file) or not _MANIFEST_NAME.match(name)
                or _step_of(file) != step or _step_of(name) != step):
            raise CheckpointError(f"checkpoint manifest {where} names {str(file)[:80]!r}, which is not this "
                                  f"run's checkpoint of its step: refused")
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
        except Exception as err:  # noqa: BLE001 - numpy and zipfile raise many types on bad bytes
            raise CheckpointError(f"checkpoint {manifest['file']} in {self.storage.uri} is unreadable: "
                                  f"{err or type(err).__name__}") from None

    def load_step(self, step: int) -> Checkpoint:
        """Load and verify the checkpoint of ``step``."""
        return self.load(_manifest_name(step))

    def resume_point(self, step: int | None = None) -> str:
        """The manifest to resume from: step ``step``'s, or the newest. The newest is refused when checkpoint
        data newer than it has no manifest (an upload cut off, or a manifest deleted): resuming from an older
        checkpoint is then the user's choice, by step."""
        steps = self.steps()
        if step is not None:
            if step not in steps:
                have = ", ".join(map(str, steps)) or "none"
                raise CheckpointError(f"no checkpoint of step {step} in {self.storage.uri} (steps: {have})")
            return _manifest_name(step)
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.storage.uri}")
        newer = sorted({_step_of(d) for d in self.storage.names(_PREFIX, ".npz") if _DATA_NAME.match(d)
                        and _step_of(d) > steps[-1]})
        if newer:
            raise CheckpointError(
                f"{self.storage.uri} holds checkpoint data of step {newer[-1]} without a manifest (an upload cut "
                f"off, or its manifest deleted); the newest complete checkpoint is step {steps[-1]}: resume from "
                f"it with --from-step {steps[-1]}")
        return _manifest_name(steps[-1])

    def prune(self) -> None:
        """Keep the newest ``keep`` manifests; delete the data none of them names that is older than all of
        them, or whose step's kept manifest names other data (a rewritten step). Data newer than the oldest
        kept manifest and without a manifest of its step stays: it may be all that is left of a checkpoint."""
        manifests = [n for n in self.manifests() if _MANIFEST_NAME.match(n)]
        for old in manifests[: max(0, len(manifests) - self.keep)]:
            self.storage.delete(old)  # the manifest first: a half-deleted checkpoint never looks valid
        kept: dict[int, str | None] = {}
        for name in manifests[-self.keep:]:
            try:
                kept[_step_of(name)] = str(self.manifest(name)["file"])
            except CheckpointError:
                kept[_step_of(name)] = None  # unreadable: its data cannot be told apart; left for the user
        if not kept:
            return
        oldest = min(kept)
        for data in self.storage.names(_PREFIX, ".npz"):
            if not _DATA_NAME.match(data) or data in kept.values():
                continue
            step = _step_of(data)
            if step < oldest or kept.get(step) is not None:
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
