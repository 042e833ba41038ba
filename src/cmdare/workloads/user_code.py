"""Calling a practitioner's code: bounded in time, and every way out of it said in one line.

A factory (of a model, a dataset, a loss) and the driver's one-batch check run in a helper thread that the caller
waits for at most :func:`user_code_timeout_s` seconds (``CMDARE_USER_CODE_TIMEOUT``, default 120): code that
never returns ends the command with one line naming it, rather than hanging. A Python thread cannot be killed, so
the helper is a daemon thread: the command ends (the CLI exits) while it still runs. Running in a helper thread
also tells the user's ``KeyboardInterrupt`` (raised by the code, in that thread) from a Ctrl-C (always delivered
to the main thread, which then stops waiting).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cmdare.errors import UserInputError

__all__ = ["DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "UserCodeTimeoutError", "describe", "run_bounded", "user_code_timeout_s"]

T = TypeVar("T")

TIMEOUT_ENV = "CMDARE_USER_CODE_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0  # one factory call, or one step of the check; a dataset factory that downloads may need more


class UserCodeTimeoutError(UserInputError):
    """Raised when the user's code did not return within the bound."""


def user_code_timeout_s() -> float:
    """Seconds one call of the user's code may take: ``CMDARE_USER_CODE_TIMEOUT``, else 120.

    Raises:
        UserInputError: the variable is not a positive number.
    """
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UserInputError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


def describe(err: BaseException) -> str:
    """``err`` in one line: ``ValueError: no data here``, ``sys.exit(5)``, ``KeyboardInterrupt``."""
    if isinstance(err, SystemExit):
        return f"sys.exit({err.code!r})" if err.code is not None else "sys.exit()"
    first = str(err).splitlines()[0].strip() if str(err).strip() else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def run_bounded(fn: Callable[[], T], what: str | Callable[[], str], timeout_s: float | None = None) -> T:
    """``fn()`` in a daemon thread, waited for at most ``timeout_s`` (default :func:`user_code_timeout_s`);
    what ``fn`` raised (anything, ``SystemExit`` and ``KeyboardInterrupt`` included) is raised here.

    Raises:
        UserCodeTimeoutError: ``fn`` did not return in time (``what``, or what it returns, names the code).
    """
    limit = user_code_timeout_s() if timeout_s is None else timeout_s
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread as it was
            outcome["error"] = err

    thread = threading.Thread(target=target, name="cmdare-user-code", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        name = what() if callable(what) else what
        raise UserCodeTimeoutError(f"{name} did not return within {limit:g} s (a loop that never ends? if it needs "
                             f"longer, set {TIMEOUT_ENV}=SECONDS)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
