"""Checkpoints: atomic writes, a SHA-256 manifest verified on load, the latest found by step.

Layout of a run's checkpoint directory::

    ckpt-00000200.npz    parameters and momentum in model order, buffers, metadata
    ckpt-00000200.json   manifest: file name, size, sha256, step (written after the data)

A checkpoint counts only once its manifest exists, so a crash mid-write leaves the previous one
intact. Parameters are stored in model order, so a run can resume with another placement.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cmdare.errors import CheckpointError

_PREFIX = "ckpt-"


@dataclass(frozen=True)
class Checkpoint:
    """Everything needed to resume: global step, parameters and momentum (model order), buffers."""

    step: int
    params: np.ndarray
    momentum: np.ndarray
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(directory: str | Path, ckpt: Checkpoint, keep: int = 3) -> tuple[Path, int]:
    """Write ``ckpt`` atomically; keep the newest ``keep`` checkpoints. Returns (path, bytes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {"params": ckpt.params, "momentum": ckpt.momentum}
    arrays.update({f"buffer::{k}": v for k, v in ckpt.buffers.items()})
    meta = dict(ckpt.meta, step=ckpt.step, saved_at=time.time())
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    name = f"{_PREFIX}{ckpt.step:09d}"
    path = directory / f"{name}.npz"
    _atomic_write(path, data)
    manifest = {"file": path.name, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "step": ckpt.step}
    _atomic_write(directory / f"{name}.json", json.dumps(manifest).encode())
    _prune(directory, keep)
    return path, len(data)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load and verify a checkpoint (``.npz`` or its ``.json`` manifest path)."""
    path = Path(path)
    manifest_path = path.with_suffix(".json")
    try:
        manifest = json.loads(manifest_path.read_text())
        data = (path.parent / manifest["file"]).read_bytes()
    except FileNotFoundError as err:
        raise CheckpointError(f"checkpoint {path} is missing ({err.filename})") from err
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint manifest {manifest_path} is unreadable") from err
    if len(data) != manifest["size_bytes"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise CheckpointError(f"checkpoint {path.name} is corrupt: checksum mismatch")
    with np.load(io.BytesIO(data)) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        buffers = {k.split("::", 1)[1]: z[k] for k in z.files if k.startswith("buffer::")}
        return Checkpoint(int(meta["step"]), z["params"], z["momentum"], buffers, meta)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint with a manifest in ``directory``, or None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    manifests = sorted(directory.glob(f"{_PREFIX}*.json"))
    return manifests[-1].with_suffix(".npz") if manifests else None


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _prune(directory: Path, keep: int) -> None:
    manifests = sorted(directory.glob(f"{_PREFIX}*.json"))
    for old in manifests[: max(0, len(manifests) - keep)]:
        old.unlink(missing_ok=True)
        old.with_suffix(".npz").unlink(missing_ok=True)
