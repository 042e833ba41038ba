"""Pack the running cmdare into a wheel for a cluster's nodes (cmdare is not on PyPI under its name).

The wheel holds the package's files as imported here (an editable checkout or an installed copy, without
byte-code) and the installed distribution's metadata (its dependencies and the ``cmdare`` command), so a node
installs exactly the version this machine runs. Only the standard library is used: no build backend, no
network.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path

import cmdare
from cmdare import __version__
from cmdare.errors import UserInputError

__all__ = ["pack_running_wheel"]

_TAG = "py3-none-any"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pack_running_wheel(out_dir: Path) -> Path:
    """Write ``cmdare-<version>-py3-none-any.whl`` of the running package into ``out_dir``; returns its path.

    Raises:
        UserInputError: cmdare's distribution metadata is not installed (run from a bare source tree).
    """
    try:
        dist = metadata.distribution("cmdare")
    except metadata.PackageNotFoundError:
        raise UserInputError("cmdare is not installed (no distribution metadata): install it (pip install -e .) "
                             "or pass --wheel / --cmdare-spec") from None
    package = Path(cmdare.__file__).resolve().parent
    info = f"cmdare-{__version__}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            files[f"cmdare/{path.relative_to(package).as_posix()}"] = path.read_bytes()
    files[f"{info}/METADATA"] = (dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: cmdare\n"
                                 f"Version: {__version__}\n").encode()
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points.encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: cmdare cluster-config\nRoot-Is-Purelib: true\n"
                              f"Tag: {_TAG}\n").encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow([name, _record_hash(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"cmdare-{__version__}-{_TAG}.whl"
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    tmp.replace(target)
    return target
