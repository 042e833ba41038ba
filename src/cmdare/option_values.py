"""Numbers the user gives (options, spec fields): finite and within the range the option makes sense for.

Typer's ``min=``/``max=`` let ``inf`` and ``1e308`` through (and ``nan`` slips past any comparison); a value
that then overflows a model ends in a traceback. :func:`check_number` refuses such values in one line.
"""

from __future__ import annotations

import math

from cmdare.errors import UnknownNameError, UserInputError

__all__ = ["DEFAULT_BATCH_SIZE", "PRECISIONS", "TOPOLOGIES", "check_number", "check_precision", "check_topology"]

#: Per-worker batch size of ``cmdare train`` unless told, and the batch ``predict``, ``plan`` and ``train --simulate``
#: predict at unless told (``--batch-size``): the step time a run sees is the step time at its batch.
DEFAULT_BATCH_SIZE = 32

#: What a run's workers compute in (``--precision`` of ``train``, ``predict``, ``plan``): float32 (TF32 convolutions
#: on GPUs from Ampere on, as PyTorch does by default), or automatic mixed precision in bfloat16 or float16.
PRECISIONS = ("fp32", "amp-bf16", "amp-fp16")


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`.

    Raises:
        UnknownNameError: it is not (the message lists them).
    """
    return _one_of(precision, "--precision", PRECISIONS)


#: How a run's workers train together (``--topology`` of ``predict cluster-speed``): through parameter servers, or
#: all-reduce (every worker holds the model, gradients averaged each step).
TOPOLOGIES = ("ps", "allreduce")


def check_topology(topology: str) -> str:
    """``topology`` if it is one of :data:`TOPOLOGIES`.

    Raises:
        UnknownNameError: it is not (the message lists them).
    """
    return _one_of(topology, "--topology", TOPOLOGIES)


def _one_of(value: str, option: str, names: tuple[str, ...]) -> str:
    if value not in names:
        raise UnknownNameError(option, str(value), list(names))
    return value


def check_number(value: object, option: str, low: float | None = None, high: float | None = None,
                 what: str = "") -> float:
    """``value`` as a float if it is a finite number in ``[low, high]`` (either bound optional).

    Args:
        value: a number, or text holding one.
        option: the option's name for the message (``--size-mb``).
        what: the unit or meaning, for the message (``MB``, ``seconds``).

    Raises:
        UserInputError: not a number, not finite, or out of range; the message names the option and the range.
    """
    unit = f" {what}" if what else ""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise UserInputError(f"{option} must be a finite number{' of ' + what if what else ''}, got {value!r}")
    if low is not None and number < low:
        raise UserInputError(f"{option} must be at least {low:g}{unit}, got {value!r}")
    if high is not None and number > high:
        raise UserInputError(f"{option} must be at most {high:g}{unit}, got {value!r}")
    return number
