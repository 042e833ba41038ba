"""Profiles of the built-in models kept on disk: ``cmdare workloads``, ``predict`` and ``plan`` read them
instead of building every network again (and without importing torch).

A profile depends only on the zoo's code, the input shape, the number of classes and torch's checkpoint
format, so the cache file is named after a fingerprint of the ``cmdare.workloads`` sources and the torch
version: any change to either starts a new file. Only built-in names are cached (a user's registered model
may change under the same name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from cmdare.file_cache import cached_json, code_digest

__all__ = ["cached_profile", "profile_cache_file"]


@lru_cache(maxsize=1)
def profile_cache_file() -> Path:
    """The cache file of this code and torch version (under the data directory's ``models/profiles``)."""
    from cmdare.paths import models_dir, private_dir

    torch_version = ""
    with contextlib.suppress(metadata.PackageNotFoundError):
        torch_version = metadata.version("torch")
    digest = code_digest(Path(__file__).parent.glob("*.py"), torch_version)
    return private_dir(models_dir() / "profiles") / f"profiles-{digest}.json"


def cached_profile(name: str, shape: tuple[int, int, int], num_classes: int,
                   compute: Callable[[], Any], from_dict: Callable[[dict[str, Any]], Any]) -> Any:
    """The profile of built-in model ``name`` at ``shape`` and ``num_classes``: from the cache file, else
    ``compute()``, then stored."""
    key = f"{name}|{'x'.join(map(str, shape))}|{num_classes}"
    return cached_json(profile_cache_file(), key, compute, lambda profile: profile.to_dict(), from_dict)
