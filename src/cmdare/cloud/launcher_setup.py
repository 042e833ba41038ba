"""What every node of a generated cluster gets before Ray starts: Python, Ray, cmdare, its storage and Ray's token.

* **Python**: cmdare needs Python >= 3.11, which the clouds' deep-learning images lack (3.10 or older), so
  each node makes a virtual environment with `uv <https://docs.astral.sh/uv/>`_ (a managed CPython) at
  ``~/cmdare-venv`` and activates it from ``~/.bashrc``: Ray's command runner and ``ray attach`` source it.
* **cmdare** is not on PyPI under that name: a local wheel travels in ``file_mounts`` and is installed from
  there (``--wheel``), or the user names a pip spec (``--cmdare-spec``); with ``s3://``/``gs://`` storage the
  matching extra (``[s3]``/``[gcs]``) comes along. pip takes extras on a wheel path
  (``pip install "$HOME/cmdare-wheels/cmdare-0.1.0-py3-none-any.whl[s3]"``) but not a ``~`` inside quotes.
* **Environment**: ``RAY_AUTH_MODE=token`` and ``CMDARE_STORAGE`` are exported by every ``ray start``
  (actors inherit them) and appended to ``~/.bashrc`` (the driver run by ``ray attach``/``ray exec`` sees them).
* **Token**: Ray (2.52+) reads the token from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
  ``~/.ray/auth_token``; ``ray get-auth-token --generate`` writes the last one. The user's file is copied to
  the same path on every node through ``file_mounts``.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from cmdare import __version__
from cmdare.errors import UserInputError

__all__ = [
    "AUTH_ENV",
    "PLACEHOLDER_STORAGE",
    "RAY_TOKEN_COMMAND",
    "RAY_TOKEN_PATH",
    "STORAGE_ENV",
    "WHEEL_DIR",
    "Install",
    "checked_storage",
    "env_prefix",
    "find_wheel",
    "parse_env",
    "persist_env",
    "python_commands",
    "ray_install_command",
    "resolve_install",
    "storage_extras",
]

Warn = Callable[[str], None]

RAY_TOKEN_PATH = "~/.ray/auth_token"
RAY_TOKEN_COMMAND = "ray get-auth-token --generate"
AUTH_ENV = {"RAY_AUTH_MODE": "token"}
STORAGE_ENV = "CMDARE_STORAGE"
# What transient clusters get without --storage: invalid bucket names (upper case), so nothing is written
# anywhere until the user fills in theirs.
PLACEHOLDER_STORAGE = {"gcp": "gs://FILL-IN-YOUR-BUCKET/cmdare", "aws": "s3://FILL-IN-YOUR-BUCKET/cmdare"}
WHEEL_DIR = "~/cmdare-wheels"
VENV_DIR = "~/cmdare-venv"
PYTHON = f"{sys.version_info.major}.{max(sys.version_info.minor, 11)}"  # this machine's minor, at least 3.11
UV_INSTALLER = "https://astral.sh/uv/install.sh"
# Storage URL scheme -> (the cloud it belongs to, the cmdare extra with its fsspec driver).
_CLOUD_STORAGE = {"s3": ("aws", "s3"), "gs": ("gcp", "gcs"), "gcs": ("gcp", "gcs")}
_WHEEL_NAME = re.compile(r"cmdare-[A-Za-z0-9_.+!]+(-[A-Za-z0-9_.+!]+){3,4}\.whl")
_NAMED_SPEC = re.compile(r"cmdare\s*(\[[^\]]*\])?\s*(.*)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Install:
    """How the nodes get cmdare: pip commands, files to copy there (remote -> local) and a line for the header."""

    commands: tuple[str, ...]
    file_mounts: dict[str, str] = field(default_factory=dict)
    source: str = ""


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def checked_storage(cloud: str, storage: str | None, *, transient: bool, force: bool, warn: Warn) -> str | None:
    """The checkpoint location every node gets as ``CMDARE_STORAGE``, checked for ``cloud``.

    A cloud cluster needs a place every node reaches and that outlives them: ``s3://`` or ``gs://``; a local
    cluster (``cloud='local'``) may also use a directory (made absolute).

    Raises:
        UserInputError: a local path or another scheme on a cloud, or ``transient`` without storage (unless
            ``force``).
    """
    text = "" if storage is None else str(storage).strip()
    if any(c.isspace() or c in "'\"`" for c in text):
        raise UserInputError(f"--storage {text!r}: spaces and quotes are not allowed in the location")
    if not text:
        if cloud != "local" and transient:
            if not force:
                # Transient workers never train without durable storage: the nodes get a placeholder that
                # no bucket can have (upper case), so `cmdare train` stops at its storage check until it is
                # filled in, instead of keeping checkpoints on the head.
                placeholder = PLACEHOLDER_STORAGE[cloud]
                warn(f"no --storage: transient workers need durable storage; the config names {placeholder}, "
                     "which `cmdare train` refuses until you fill in your bucket (or pass --storage; --force "
                     "keeps checkpoints on the head node only)")
                return placeholder
            warn("no --storage (--force): checkpoints stay on the head node and are lost with it")
        return None
    scheme = _scheme(text)
    if cloud == "local":
        if scheme in ("", "file"):
            return str(Path(text.removeprefix("file://")).expanduser().absolute())
        return text.rstrip("/")
    if scheme in ("", "file"):
        raise UserInputError(f"--storage {text}: a local path is not reachable from every {cloud} node and dies "
                             "with its server; use s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    if scheme not in _CLOUD_STORAGE:
        raise UserInputError(f"--storage {text}: a {cloud} cluster takes s3:// or gs:// storage")
    home = _CLOUD_STORAGE[scheme][0]
    if home != cloud:
        warn(f"--storage {text} is {home} storage for a {cloud} cluster: checkpoints cross clouds (egress charges, "
             f"slower uploads) and every node needs credentials for it")
    return text.rstrip("/")


def storage_extras(storage: str | None) -> tuple[str, ...]:
    """The cmdare extras the nodes need for ``storage`` (``('s3',)``, ``('gcs',)`` or none)."""
    entry = _CLOUD_STORAGE.get(_scheme(storage or ""))
    return (entry[1],) if entry else ()


def find_wheel(search_dir: Path | None = None) -> Path | None:
    """The newest ``dist/cmdare-<installed version>-*.whl`` under ``search_dir`` (default: the current directory)."""
    dist = (search_dir or Path.cwd()) / "dist"
    found = [p for p in dist.glob(f"cmdare-{__version__}-*.whl") if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime, p.name)) if found else None


def resolve_install(*, wheel: str | Path | None, cmdare_spec: str | None, extras: tuple[str, ...],
                    search_dir: Path | None, warn: Warn) -> Install:
    """How the nodes install cmdare: ``wheel`` (copied to ``~/cmdare-wheels/``), ``cmdare_spec``, or the newest
    wheel of this version in ``dist/``.

    Raises:
        UserInputError: both or neither given (and no wheel in ``dist/``), a missing or misnamed wheel, a bare
            ``cmdare`` spec (not a published name) or a local file as a spec.
    """
    if wheel is not None and cmdare_spec is not None:
        raise UserInputError("pass --wheel or --cmdare-spec, not both")
    if cmdare_spec is not None:
        spec = _spec_with_extras(cmdare_spec, extras, warn)
        return Install((f"pip install -U {shlex.quote(spec)}",), {}, spec)
    if wheel is None:
        wheel = find_wheel(search_dir)
        if wheel is not None:
            warn(f"installing {wheel} on every node (the newest dist/cmdare-{__version__}-*.whl here; "
                 "--wheel or --cmdare-spec chooses another)")
        else:
            from cmdare.cloud.wheel_pack import pack_running_wheel
            from cmdare.paths import data_dir

            wheel = pack_running_wheel(data_dir() / "wheels")
            warn(f"installing the cmdare this machine runs on every node: packed into {wheel} "
                 "(--wheel or --cmdare-spec chooses another)")
    path = Path(wheel).expanduser()
    if not path.is_file():
        raise UserInputError(f"--wheel {wheel}: no such file")
    if not _WHEEL_NAME.fullmatch(path.name):
        raise UserInputError(f"--wheel {wheel}: not a cmdare wheel (expected cmdare-VERSION-PY-ABI-PLATFORM.whl)")
    on_node = f"$HOME/cmdare-wheels/{path.name}"  # pip does not expand ~ and a quoted ~ stays one
    extra = f"[{','.join(extras)}]" if extras else ""
    # The second install replaces a same-version cmdare already on a reused node with this wheel's files.
    command = f'pip install "{on_node}{extra}" && pip install --force-reinstall --no-deps "{on_node}"'
    return Install((command,), {f"{WHEEL_DIR}/{path.name}": str(path.resolve())}, str(path.resolve()))


def _spec_with_extras(spec: str, extras: tuple[str, ...], warn: Warn) -> str:
    text = spec.strip()
    if not text:
        raise UserInputError("--cmdare-spec is empty")
    extra = f"[{','.join(extras)}]" if extras else ""
    named = _NAMED_SPEC.fullmatch(text)
    if named and (not named.group(2) or named.group(2)[0] in "=<>!~@"):
        rest = named.group(2).strip()
        if not rest:
            raise UserInputError("--cmdare-spec cmdare: cmdare is not published under that name; pass a version "
                                 "from your own index (cmdare==X), git+https://..., a wheel URL, or --wheel PATH")
        ext = named.group(1) or extra
        return f"cmdare{ext} {rest}" if rest.startswith("@") else f"cmdare{ext}{rest}"
    if "://" in text or text.startswith("git+"):
        return f"cmdare{extra} @ {text}" if extra else text
    if text.endswith((".whl", ".tar.gz", ".zip")) or Path(text).expanduser().exists():
        raise UserInputError(f"--cmdare-spec {text} looks like a file of this machine, which the nodes do not "
                             "have; pass it as --wheel")
    if extra:
        warn(f"--cmdare-spec {text}: cannot add the {extra} extra the storage needs; include it yourself")
    return text


def env_prefix(env: Mapping[str, str]) -> str:
    """``export A=1; export B=2`` for a shell command line (values quoted)."""
    return "; ".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())


def persist_env(env: Mapping[str, str]) -> list[str]:
    """Commands appending ``export NAME=VALUE`` to ``~/.bashrc`` once (Ray's command runner sources it)."""
    return [_append_once(f"export {name}={shlex.quote(value)}") for name, value in env.items()]


def _append_once(line: str) -> str:
    quoted = shlex.quote(line)
    return f"grep -qxF {quoted} ~/.bashrc || echo {quoted} >> ~/.bashrc"


def parse_env(command: str) -> dict[str, str]:
    """The variables a command line sets for its commands: ``export A=1; B=2 cmd`` -> ``{'A': '1', 'B': '2'}``."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=";")
    lex.whitespace_split = True
    env: dict[str, str] = {}
    words: list[str] = []
    for token in [*lex, ";"]:
        if token != ";":
            words.append(token)
            continue
        exported = bool(words) and words[0] == "export"
        for word in words[1:] if exported else words:
            name, eq, value = word.partition("=")
            if not (eq and name.isidentifier()):
                break
            env[name] = value
        words = []
    return env


def python_commands() -> list[str]:
    """Make ``~/cmdare-venv`` (Python :data:`PYTHON` via uv) and activate it in ``~/.bashrc``."""
    return [
        f"command -v uv >/dev/null 2>&1 || curl -LsSf {UV_INSTALLER} | sh",
        f'"$(command -v uv || echo "$HOME/.local/bin/uv")" venv --seed --allow-existing --python {PYTHON} '
        f'"$HOME/cmdare-venv"',
        _append_once(f"source {VENV_DIR}/bin/activate"),
    ]


def ray_install_command() -> str:
    """``pip install`` of Ray pinned to this machine's version (the cluster launcher needs the same Ray)."""
    try:
        pin = f"ray[default]=={metadata.version('ray')}"
    except metadata.PackageNotFoundError:
        pin = "ray[default]"
    return f'pip install -U "{pin}"'
