"""A storage location: a local directory or any fsspec URL, holding named objects.

cmdare keeps what must outlive a transient server (checkpoints, their manifests, a run's control
files) in a :class:`Storage`: a local directory (``/mnt/ckpt``, ``file:///mnt/ckpt``) or an object
store (``s3://bucket/prefix``, ``gs://bucket/prefix``, any protocol fsspec knows). Objects are
written whole: on a local disk through a temporary file, ``fsync`` and a rename; on an object store
as one PUT, which the store makes visible only once complete. Either way a reader sees an object
entirely or not at all.

fsspec's options for a protocol (an endpoint URL, a profile) come from ``CMDARE_STORAGE_OPTIONS``
(a JSON object), besides each library's own environment variables (``AWS_ENDPOINT_URL``,
``STORAGE_EMULATOR_HOST``, ...).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from cmdare.errors import StorageError, UserInputError

__all__ = ["MissingObjectError", "Storage", "mask_credentials", "storage_options"]

# ``scheme://user:password@`` anywhere in a text: the password is what must not show.
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):(?P<secret>[^@\s/]*)@")


def mask_credentials(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (``sftp://alice:***@host/...``)."""
    return _CREDENTIALS.sub(lambda m: f"{m['head']}:***@", text)

# Packages that provide a protocol, for the hint when one is missing.
_EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}


class MissingObjectError(StorageError, FileNotFoundError):
    """Raised when a named object does not exist in the storage."""


def storage_options() -> dict[str, Any]:
    """fsspec options from ``CMDARE_STORAGE_OPTIONS`` (a JSON object), or none."""
    text = os.environ.get("CMDARE_STORAGE_OPTIONS", "").strip()
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as err:
        raise UserInputError(f"CMDARE_STORAGE_OPTIONS is not valid JSON: {err}") from None
    if not isinstance(options, dict):
        raise UserInputError("CMDARE_STORAGE_OPTIONS must be a JSON object, e.g. {\"endpoint_url\": \"http://...\"}")
    return options


class Storage:
    """Named objects under one location (``uri``); :meth:`child` gives a sub-location.

    Args:
        uri: a local path or an fsspec URL (a password in it is used, and shown nowhere: :attr:`uri`, every
            message and every :meth:`url` have it masked).
        options: fsspec options for a remote protocol (default: :func:`storage_options`).
    """

    def __init__(self, uri: str | os.PathLike[str], options: dict[str, Any] | None = None,
                 _fs: Any = None, _root: str | None = None):
        text = os.fspath(uri)
        if not text.strip():
            raise UserInputError("--storage must name a directory or a URL such as s3://bucket/prefix")
        self.protocol = text.split("://", 1)[0].lower() if "://" in text else "file"
        self._options = storage_options() if options is None else options
        if self.protocol == "file":
            self.path: Path | None = Path(text.removeprefix("file://")).expanduser().absolute()
            self.uri = self._url = str(self.path)
            self._fs, self._root = None, str(self.path)
        else:
            self.path = None
            self._url = text.rstrip("/")  # with its credentials: for fsspec only
            self.uri = mask_credentials(self._url)
            self._fs = _fs
            self._root = _root

    @property
    def is_local(self) -> bool:
        """True for a directory of this machine's file system."""
        return self.path is not None

    def __repr__(self) -> str:
        return f"Storage({self.uri!r})"

    def __str__(self) -> str:
        return self.uri

    def child(self, name: str) -> Storage:
        """The location ``name`` inside this one (same file system, same options)."""
        if self.path is not None:
            return Storage(self.path / name, self._options)
        fs, root = self._filesystem()
        return Storage(f"{self._url}/{name}", self._options, _fs=fs, _root=f"{root}/{name}")

    def url(self, name: str) -> str:
        """Where object ``name`` lives, as a path or URL to show to the user."""
        return str(self.path / name) if self.path is not None else f"{self.uri}/{name}"

    # -- objects -------------------------------------------------------------------------------
    def put(self, name: str, data: bytes) -> None:
        """Write object ``name`` whole (readers see all of it or nothing)."""
        if self.path is not None:
            self._local_put(self.path / name, data)
            return
        fs, root = self._filesystem()
        self._remote("write", name, lambda: fs.pipe_file(f"{root}/{name}", data))

    def get(self, name: str) -> bytes:
        """Object ``name``'s bytes. Raises :class:`MissingObjectError` when it does not exist."""
        if self.path is not None:
            try:
                return (self.path / name).read_bytes()
            except FileNotFoundError:
                raise MissingObjectError(f"{self.url(name)} does not exist") from None
            except OSError as err:
                raise StorageError(f"cannot read {self.url(name)}: {err.strerror or err}") from err
        fs, root = self._filesystem()
        return self._remote("read", name, lambda: fs.cat_file(f"{root}/{name}"))

    def names(self, prefix: str = "", suffix: str = "") -> list[str]:
        """Sorted names of the objects directly in this location that start with ``prefix`` and end with
        ``suffix`` (an empty list when the location does not exist yet)."""
        if self.path is not None:
            if not self.path.is_dir():
                return []
            found = [p.name for p in self.path.iterdir() if p.is_file()]
        else:
            fs, root = self._filesystem()
            try:
                listing = self._remote("list", "", lambda: fs.ls(root, detail=True, refresh=True))
            except MissingObjectError:
                return []
            found = [str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in listing if e.get("type") != "directory"]
        return sorted(n for n in found if n.startswith(prefix) and n.endswith(suffix) and not n.startswith(".tmp-"))

    def delete(self, name: str) -> None:
        """Remove object ``name`` (nothing happens when it does not exist)."""
        if self.path is not None:
            (self.path / name).unlink(missing_ok=True)
            return
        fs, root = self._filesystem()
        with contextlib.suppress(MissingObjectError):
            self._remote("delete", name, lambda: fs.rm_file(f"{root}/{name}"))

    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists."""
        if self.path is not None:
            return (self.path / name).is_file()
        fs, root = self._filesystem()
        return bool(self._remote("read", name, lambda: fs.exists(f"{root}/{name}")))

    def check_writable(self) -> None:
        """Write, read back and remove a probe object: a bad location fails now, in one line, not at the
        first checkpoint."""
        name = f".cmdare-probe-{os.getpid()}"
        self.put(name, b"ok")
        try:
            if self.get(name) != b"ok":
                raise StorageError(f"{self.uri} returned other bytes than were written")
        finally:
            self.delete(name)

    # -- internals -----------------------------------------------------------------------------
    def _local_put(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a run's objects: its owner's only
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as err:
            with contextlib.suppress(OSError):  # e.g. a file where a directory should be: no tmp to remove
                tmp.unlink(missing_ok=True)
            raise StorageError(f"cannot write {path}: {err.strerror or err}") from err

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            import fsspec

            try:
                self._fs, self._root = fsspec.core.url_to_fs(self._url, **self._options)
            except ImportError as err:
                named = getattr(err, "name", None) or next(iter(re.findall(r'"([\w.-]+)"', str(err))), None)
                package, extra = _EXTRAS.get(self.protocol, (named, ""))
                if package is None:
                    raise StorageError(f"storage {self.uri}: {_first_line(err)}") from None
                hint = f"pip install 'cmdare[{extra}]'" if extra else f"pip install {package}"
                raise StorageError(f"storage {self.uri} needs {package}: {hint}") from None
            except ValueError as err:  # unknown protocol
                raise UserInputError(f"--storage {self.uri}: {_first_line(err)}") from None
            except Exception as err:  # noqa: BLE001 - a backend that connects at once (sftp) fails its own way
                raise StorageError(f"cannot open storage {self.uri}: {_first_line(err)}") from None
            self._root = str(self._root).rstrip("/")
        assert self._root is not None
        return self._fs, self._root

    def _remote(self, action: str, name: str, call: Any) -> Any:
        where = self.url(name) if name else self.uri
        try:
            return call()
        except FileNotFoundError:
            if action == "write":  # the bucket (or its parent path) is missing
                raise StorageError(f"cannot write {where}: the bucket or path does not exist") from None
            raise MissingObjectError(f"{where} does not exist") from None
        except PermissionError as err:
            raise StorageError(f"cannot {action} {where}: permission denied ({_first_line(err)})") from err
        except Exception as err:  # noqa: BLE001 - each fsspec backend raises its own errors
            raise StorageError(f"cannot {action} {where}: {_first_line(err)}") from err


def _first_line(err: BaseException) -> str:
    text = mask_credentials(str(err).strip())
    return text.splitlines()[0] if text else type(err).__name__
