"""The options of ``cmdare plan`` and ``plan simulate`` read and checked: deadlines, clouds, GPU names, retired GPU
types, the start hour. Each mistake is one line naming what is valid."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from cmdare.errors import UnknownNameError, UserInputError

__all__ = ["check_names", "check_offered", "cloud_name", "parse_deadline_s", "retired_gpus", "retired_note",
           "split_names", "start_hour_option", "tomorrow_evening"]

_UNITS_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(-?)((?:\d+(?:\.\d*)?\s*(?:s|sec|min|m|h|d)\s*)+)$", re.I)


def parse_deadline_s(text: str, now: datetime | None = None) -> float:
    """Seconds from now until a deadline given as ``2h``, ``1h30m``, ``90min``, ``600`` (seconds)
    or a clock time ``2026-11-29T18:00`` (local time).

    Raises:
        UserInputError: if it cannot be parsed or lies in the past.
    """
    text = text.strip()
    seconds: float | None = None
    try:
        seconds = float(text)
    except ValueError:
        m = _DURATION.match(text)
        if m:
            parts = re.findall(r"(\d+(?:\.\d*)?)\s*(sec|min|s|m|h|d)", m.group(2), re.I)
            seconds = sum(float(v) * _UNITS_S[u.lower()] for v, u in parts) * (-1 if m.group(1) else 1)
        else:
            try:
                when = datetime.fromisoformat(text)
            except ValueError:
                raise UserInputError(f"cannot read deadline {text!r}; use e.g. 2h, 1h30m, 90min, 600 or "
                                     f"{tomorrow_evening(now)}") from None
            ref = now or (datetime.now(when.tzinfo) if when.tzinfo else datetime.now())
            seconds = (when - ref).total_seconds()
    if not math.isfinite(seconds) or seconds <= 0:
        raise UserInputError(f"the deadline {text!r} is in the past; give a duration such as 2h")
    return seconds


def tomorrow_evening(now: datetime | None = None) -> str:
    """An example clock-time deadline that is never in the past: tomorrow at 18:00, e.g. ``2026-12-05T18:00``."""
    day = (now or datetime.now()) + timedelta(days=1)
    return day.replace(hour=18, minute=0, second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M")


def cloud_name(text: str) -> str:
    """``--cloud`` in any case (``AWS`` is ``aws``); a cloud the catalog does not know is refused when the
    models load, in one line listing the valid ones."""
    return text.strip().lower()


def retired_gpus(prices, gpus: list[str]) -> list[str]:
    """Those of ``gpus`` that the plan's cloud has retired (every offering of the type there is marked retired in
    the catalog: K80s), in the order given."""
    out = []
    for gpu in gpus:
        offers = prices.catalog.find(gpu=gpu, cloud=prices.cloud, role="worker")
        if offers and all(o.retired for o in offers):
            out.append(gpu)
    return out


def retired_note(gpus: list[str], cloud: str, then: str = "its prices and speeds replay the CM-DARE/ICAC 2019 runs"
                  ) -> str:
    """Why a retired GPU type is flagged (for K80: the cloud rents it no more and current PyTorch cannot use it),
    then what the plan does with it."""
    from cmdare.cloud.launcher_nodes import GPU_SOFTWARE

    names = ", ".join(g.upper() for g in gpus)
    ccs = sorted({GPU_SOFTWARE[g.upper()].compute_capability for g in gpus if g.upper() in GPU_SOFTWARE})
    software = (f"current PyTorch CUDA builds do not run on compute capability {', '.join(ccs)} (CUDA 12 dropped "
                "it)" if ccs else "current PyTorch CUDA builds may not support it")
    return f"{names} retired: {cloud} no longer rents {'them' if len(gpus) > 1 else 'it'} and {software}; {then}"


def check_offered(prices, gpus: list[str], region: str, transient: bool) -> None:
    """Each of ``gpus`` is rented in ``region`` with that pricing; else one line saying what is (AWS sells its
    retired K80s on demand only)."""
    market = "spot/preemptible" if transient else "on-demand"
    retired = retired_gpus(prices, prices.gpus())
    for gpu in gpus:
        if prices.offered(gpu, region, transient):
            continue
        why = " (retired)" if gpu in retired else ""
        instead = "drop --transient, or " if transient and prices.offered(gpu, region, False) else ""
        others = [g for g in prices.gpus() if g not in retired and prices.offered(g, region, transient)]
        raise UserInputError(f"{prices.cloud} {region} rents no {gpu.upper()}{why} as {market} servers: {instead}"
                             f"choose another GPU type ({', '.join(others) or 'none offered there'})")


def check_names(prices, gpus: list[str], regions: list[str]) -> None:
    """Unknown GPU types and regions fail before any simulation, listing the valid names."""
    known_gpus = prices.gpus()
    for gpu in gpus:
        if gpu not in known_gpus:
            raise UnknownNameError("GPU", gpu, known_gpus)
    known_regions = prices.regions()
    for region in regions:
        if region not in known_regions:
            raise UnknownNameError(f"{prices.cloud} region", region, known_regions)


def start_hour_option(hour: int | None) -> int | None:
    """Validate ``--start-hour``."""
    if hour is not None and not 0 <= hour <= 23:
        raise UserInputError(f"--start-hour must be an hour of day 0-23, got {hour}")
    return hour


def split_names(text: str) -> list[str]:
    return [p.strip().lower() for p in text.split(",") if p.strip()]
