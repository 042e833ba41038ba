"""One exception tree for cmdare.

    CmdareError                      base; the CLI prints ``str(err)`` on one line and exits non-zero
    ├── UserInputError               bad arguments, unknown names, impossible configurations (final)
    │   ├── UnknownNameError         a registry lookup failed; lists the valid names
    │   └── DataFormatError          a file has wrong columns, bad values or cannot be parsed
    ├── DataNotFoundError            a file or directory the user named does not exist (final)
    ├── CheckpointError              a checkpoint is missing or fails its checksum (final)
    ├── StorageError                 durable storage cannot be reached, read or written (final)
    ├── StoreError                   the measurement store cannot be reached or written (final)
    ├── ClusterError                 Ray cannot be started or joined (final)
    ├── RunInterruptedError          the user stopped a run (Ctrl-C, SIGTERM); exit status 130
    └── TransientError               retryable: a server was revoked or is unreachable
        ├── WorkerLostError          a worker's actor or node died
        └── ShardLostError           a parameter shard's actor or node died

Every class pickles (they cross Ray actor boundaries) because all fields go through ``args``.
Foreign errors (Ray, SQLAlchemy, HTTP) are mapped at the boundary and chained with ``from``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CheckpointError",
    "ClusterError",
    "CmdareError",
    "DataFormatError",
    "DataNotFoundError",
    "RunInterruptedError",
    "ShardLostError",
    "StorageError",
    "StoreError",
    "TransientError",
    "UnknownNameError",
    "UserInputError",
    "WorkerLostError",
]


class CmdareError(Exception):
    """Base of every error cmdare raises on purpose."""


class UserInputError(CmdareError, ValueError):
    """Raised for bad arguments or impossible configurations; retrying will not help."""


class UnknownNameError(UserInputError):
    """Raised when a name is not in a registry (model, dataset, placement, GPU, ...)."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        super().__init__(kind, name, tuple(valid))
        self.kind, self.name, self.valid = kind, name, tuple(valid)

    def __str__(self) -> str:
        import difflib

        close = difflib.get_close_matches(self.name, self.valid, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {self.name!r}{hint}; valid: {', '.join(self.valid)}"


class DataFormatError(UserInputError):
    """Raised when an input file has the wrong columns, bad values or cannot be parsed."""


class DataNotFoundError(CmdareError, FileNotFoundError):
    """Raised when a file or directory the user named does not exist."""


class CheckpointError(CmdareError):
    """Raised when a checkpoint is missing, truncated or fails its checksum."""


class StorageError(CmdareError):
    """Raised when checkpoint storage (a directory or an fsspec URL) cannot be reached, read or written."""


class StoreError(CmdareError):
    """Raised when the measurement store cannot be reached or written."""


class ClusterError(CmdareError):
    """Raised when Ray cannot be started or the given cluster address cannot be joined."""


class RunInterruptedError(CmdareError):
    """Raised when the user stopped a training run (Ctrl-C, SIGTERM): the message says the step it stopped at, the
    checkpoint stored and how to resume. The command line exits with :attr:`exit_code`."""

    exit_code = 130  # 128 + SIGINT, as a shell reports an interrupted command


class TransientError(CmdareError):
    """A retryable failure: a server was revoked or is unreachable."""


class WorkerLostError(TransientError):
    """Raised when a worker's actor or node died."""

    def __init__(self, worker_id: int, reason: str = ""):
        super().__init__(worker_id, reason)
        self.worker_id, self.reason = worker_id, reason

    def __str__(self) -> str:
        return f"worker {self.worker_id} lost: {self.reason}"


class ShardLostError(TransientError):
    """Raised when a parameter shard's actor or node died."""

    def __init__(self, shard_id: int, reason: str = ""):
        super().__init__(shard_id, reason)
        self.shard_id, self.reason = shard_id, reason

    def __str__(self) -> str:
        return f"parameter shard {self.shard_id} lost: {self.reason}"
