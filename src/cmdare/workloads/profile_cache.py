"""Profiles of the built-in models kept on disk: ``cmdare workloads``, ``predict`` and ``plan`` read them
instead of building every network again (and without importing torch).

A profile depends only on the zoo's code, the input shape, the number of classes and torch's checkpoint
format, so the cache file is named after a fingerprint of the ``cmdare.workloads`` sources and the torch
version: any change to either starts a new file. Only built-in names are cached (a user's registered model
may change under the same name).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["cached_profile", "profile_cache_file"]


@lru_cache(maxsize=1)
def profile_cache_file() -> Path:
    """The cache file of this code and torch version (under the data directory's ``models/profiles``)."""
    from cmdare.paths import models_dir, private_dir

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    with contextlib.suppress(metadata.PackageNotFoundError):
        digest.update(metadata.version("torch").encode())
    return private_dir(models_dir() / "profiles") / f"profiles-{digest.hexdigest()[:16]}.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: profiled again and rewritten
    return data if isinstance(data, dict) else {}


def _store(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with contextlib.suppress(OSError):  # a read-only data directory: profiles are computed each time
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)


def cached_profile(name: str, shape: tuple[int, int, int], num_classes: int,
                   compute: Callable[[], Any], from_dict: Callable[[dict[str, Any]], Any]) -> Any:
    """The profile of built-in model ``name`` at ``shape`` and ``num_classes``: from the cache file, else
    ``compute()``, then stored."""
    path = profile_cache_file()
    key = f"{name}|{'x'.join(map(str, shape))}|{num_classes}"
    data = _load(path)
    if key in data:
        with contextlib.suppress(TypeError, ValueError, KeyError):
            return from_dict(data[key])
    profile = compute()
    data = _load(path)  # another process may have added profiles meanwhile
    data[key] = profile.to_dict()
    _store(path, data)
    return profile
