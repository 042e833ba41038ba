"""Files cmdare writes where the user says (``--output``, ``-o``, ``--plot``, ...): one place, one behaviour.

- What cannot be written is refused in one line (:class:`~cmdare.errors.UserInputError`), before any long work
  when the command calls :func:`check_output` first: a missing directory, a path under a regular file, a
  directory, a device or other non-regular file (``/dev/full``), a directory that takes no new file
  (``/proc``, read-only, no permission), a name longer than the file system allows.
- An existing file is never replaced, and a symbolic link never followed, unless ``force`` (``--force``): then
  the name is replaced (a link itself, never the file it points to).
- The bytes go to a new file in the same directory, which takes the name only once it is complete (a hard link
  that fails if the name appeared meanwhile, or a rename with ``force``): a failure leaves nothing behind.

:func:`one_line` escapes control characters and line separators, for any user text that goes into a generated
file's comment or a one-line message.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from cmdare.errors import UserInputError

__all__ = ["check_figure_output", "check_output", "one_line", "open_output", "output_dir", "save_figure",
           "write_output"]

_NAME_MAX = 255  # bytes of one path component on Linux and macOS file systems
_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a named pipe",
          stat.S_IFSOCK: "a socket"}


def one_line(text: object) -> str:
    """``text`` with every control character, line or paragraph separator and invisible format character
    escaped (``\\n``, ``\\x85``, ``\\u2028``): it can neither start a new line of a generated file nor hide."""
    out = []
    for ch in str(text):
        if ch not in " \\" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def _refuse(option: str, path: Path, why: str) -> UserInputError:
    return UserInputError(f"{option} {one_line(path)}: {why}")


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _why(err: OSError) -> str:
    return err.strerror or str(err)


def _check_directory(option: str, path: Path) -> None:
    parent = path.parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise _refuse(option, path, f"directory {one_line(parent)} does not exist") from None
    except NotADirectoryError:
        above = next((p for p in reversed(parent.parents) if p.exists() and not p.is_dir()), parent)
        raise _refuse(option, path, f"{one_line(above)} is a file, not a directory") from None
    except OSError as err:
        raise _refuse(option, path, f"cannot reach directory {one_line(parent)} ({_why(err)})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(option, path, f"{one_line(parent)} is a file, not a directory")


def _check_target(option: str, path: Path, force: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise _refuse(option, path, f"cannot be checked ({_why(err)})") from None
    if stat.S_ISLNK(st.st_mode):
        if not force:
            raise _refuse(option, path, "is a symbolic link: cmdare never writes through one; give --force to "
                                        "replace the link itself")
        return
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(option, path, "is a directory: give a file name")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(option, path, f"is {_kind(st.st_mode)}: cmdare writes regular files only")
    if not force:
        raise _refuse(option, path, "exists: give --force to replace it")


def _temp_file(option: str, directory: Path, shown: Path) -> tuple[int, Path]:
    """A new, empty file in ``directory`` (the umask's usual mode), open for writing; errors name ``shown``."""
    tmp = directory / f".cmdare-{secrets.token_hex(6)}.tmp"
    try:
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
    except OSError as err:
        why = f"cannot write into {one_line(directory)}" if directory != shown else "takes no new file"
        raise _refuse(option, shown, f"{why} ({_why(err)})") from None


def check_output(path: str | os.PathLike[str], option: str = "--output", force: bool = False) -> Path:
    """``path`` (``~`` expanded) if cmdare can write it, checked before any long work; else a one-line error.

    Raises:
        UserInputError: see the module docstring; the message names ``option``.
    """
    out = Path(path).expanduser()
    if not out.name or str(path).endswith(os.sep):
        raise _refuse(option, out, "names a directory: give a file name")
    if len(os.fsencode(out.name)) > _NAME_MAX:
        raise _refuse(option, out, f"the file name is longer than {_NAME_MAX} bytes")
    _check_directory(option, out)
    _check_target(option, out, force)
    fd, tmp = _temp_file(option, out.parent, out)  # the directory takes a new file: /proc, a read-only mount do not
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return out


def output_dir(path: str | os.PathLike[str], option: str) -> Path:
    """A directory the user named for cmdare's files (``--plot-dir``, ``--save-models``): created if missing, and
    it takes new files; each file in it is then written with :func:`open_output`.

    Raises:
        UserInputError: a file, a path under a file, or a directory that cannot be created or written into.
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise _refuse(option, out, "is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        above = next((p for p in reversed(out.parents) if p.exists() and not p.is_dir()), None)
        why = f"{one_line(above)} is a file, not a directory" if above else f"cannot be created ({_why(err)})"
        raise _refuse(option, out, why) from None
    fd, tmp = _temp_file(option, out, out)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return out


def _publish(option: str, tmp: Path, out: Path, force: bool) -> None:
    """Give the complete file ``tmp`` the name ``out``: never over an existing name unless ``force``."""
    if force:
        _check_target(option, out, True)  # still never over a directory or a device
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)  # fails if the name exists, even if it appeared since the check
    except FileExistsError:
        raise _refuse(option, out, "exists: give --force to replace it") from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        _check_target(option, out, False)  # a file system without hard links: check, then rename
        os.replace(tmp, out)
    else:
        os.unlink(tmp)


class _Recording:
    """A file object that remembers the first error of its writes: a writer that wraps it in its own error
    (``torch.save`` raises a ``RuntimeError`` for a full disk) is still reported as what the disk said."""

    def __init__(self, f: IO[Any]):
        self._f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@contextlib.contextmanager
def open_output(path: str | os.PathLike[str], option: str = "--output", force: bool = False,
                mode: str = "wb") -> Iterator[IO[Any]]:
    """A file object to write ``path``'s content into; the file takes its name when the block ends without an
    error, and a failure (of the block or of the disk) leaves no file behind.

    Raises:
        UserInputError: the path cannot be written (:func:`check_output`), or writing it failed.
    """
    out = check_output(path, option, force)
    fd, tmp = _temp_file(option, out.parent, out)
    recording: _Recording | None = None
    try:
        with os.fdopen(fd, mode) as f:
            recording = _Recording(f)
            yield recording
            f.flush()
            os.fsync(f.fileno())
        _publish(option, tmp, out, force)
    except Exception as err:
        disk = recording.error if recording is not None and recording.error is not None else err
        if not isinstance(disk, OSError):
            raise
        raise _refuse(option, out, f"cannot write ({_why(disk)})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def write_output(path: str | os.PathLike[str], data: bytes | str, option: str = "--output",
                 force: bool = False) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` as :func:`open_output` does; returns the path written."""
    with open_output(path, option, force, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path).expanduser()


def _figure_format(out: Path, option: str) -> str:
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = out.suffix.lstrip(".").lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise _refuse(option, out, f"matplotlib cannot write .{one_line(fmt)} files; use one of "
                                   f"{', '.join('.' + k for k in sorted(supported))}")
    return fmt


def check_figure_output(path: str | os.PathLike[str], option: str = "--plot", force: bool = False) -> Path:
    """:func:`check_output` for a figure, and its suffix names a format matplotlib writes (none: PNG)."""
    out = check_output(path, option, force)
    _figure_format(out, option)
    return out


def save_figure(fig: Any, path: str | os.PathLike[str], option: str = "--plot", force: bool = False,
                **savefig: Any) -> Path:
    """Save a matplotlib figure to ``path`` as :func:`open_output` does, in the format its suffix names
    (``.png``, ``.svg``, ``.pdf`` ...; PNG without one); an unknown suffix is a one-line error."""
    out = Path(path).expanduser()
    fmt = _figure_format(out, option)
    with open_output(out, option, force) as f:
        fig.savefig(f, format=fmt, **savefig)
    return out
