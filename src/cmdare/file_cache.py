"""Results kept on disk between commands: a JSON file of ``{key: value}`` under the data directory.

A cache file is named after a fingerprint of the code that computes its values (:func:`code_digest`), so a
change to that code starts a new file and an old value is never read by new code. Writes are atomic and
private (0600); an unreadable file or a read-only data directory only means the value is computed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["cached_json", "code_digest"]

T = TypeVar("T")


def code_digest(paths: Iterable[Path], *extra: str) -> str:
    """A 16-hex-digit fingerprint of the files at ``paths`` (names and bytes) and ``extra`` strings."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for text in extra:
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: computed again and rewritten
    return data if isinstance(data, dict) else {}


def _store(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with contextlib.suppress(OSError):  # a read-only data directory: values are computed each time
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)


def cached_json(path: Path, key: str, compute: Callable[[], T], to_dict: Callable[[T], Any],
                from_dict: Callable[[Any], T]) -> T:
    """The value of ``key`` in the cache file ``path``; else ``compute()``, stored as ``to_dict(value)``.

    A stored value that ``from_dict`` cannot read is computed again.
    """
    data = _load(path)
    if key in data:
        with contextlib.suppress(TypeError, ValueError, KeyError):
            return from_dict(data[key])
    value = compute()
    data = _load(path)  # another process may have added values meanwhile
    data[key] = to_dict(value)
    _store(path, data)
    return value
