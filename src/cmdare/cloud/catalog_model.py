"""The server catalog's data model and queries: GPU types, offerings, and price look-ups.

A :class:`Catalog` holds GPU types and the servers each cloud rents per region (:class:`Offering`);
it finds offerings and prices a worker slot or a PS server by GPU, cloud, region and pricing model.
Prices are stored per whole server (``gpus_per_server`` GPUs); :meth:`Catalog.price_per_hour_usd`
returns the price of one *worker slot* (one GPU and its share of the host), which equals the server
price for the usual one-GPU servers. Reading catalogs from files is :mod:`cmdare.cloud.catalog_loader`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cmdare.cloud.servers import CLOUDS, ServerSpec
from cmdare.errors import UnknownNameError, UserInputError

__all__ = ["LIFETIMES", "MARKETS", "RATE_BANDS", "Catalog", "GpuType", "NotOfferedError", "Offering",
           "parse_interruption_rate"]

#: Transient markets an offering may be in (``on-demand``: no transient price recorded).
MARKETS = ("preemptible", "spot", "on-demand")
#: Lifetime models an offering may name (``none``: never revoked).
LIFETIMES = ("bathtub", "exponential", "weibull", "none")


class NotOfferedError(UnknownNameError):
    """Raised when a known GPU type is not offered on a cloud or in a region; lists where it is."""

    def __str__(self) -> str:
        return f"{self.kind} are not offered in {self.name!r}; offered in: {', '.join(self.valid)}"


@dataclass(frozen=True)
class GpuType:
    """One GPU type: peak FP32 throughput, memory and where the figures come from."""

    name: str
    tflops_fp32: float
    memory_gb: float
    source: str


@dataclass(frozen=True)
class Offering:
    """A server a cloud rents in one region: a GPU worker (``gpu`` set) or a CPU-only PS (``gpu=None``).

    Prices are USD per hour for the whole server; ``spot_usd_per_h`` is the preemptible/Spot price
    (``None`` when not offered or not recorded). ``market`` is the transient market of that price
    (:data:`MARKETS`: ``preemptible``, ``spot``, or ``on-demand`` when no transient price is recorded)
    and ``lifetime`` the lifetime model its transient servers get (``bathtub``, ``exponential``,
    ``weibull`` or ``none``), parameterised by ``interruption_rate`` (``"8%/month"`` or an AWS band
    such as ``"5-10%"``) with its source and date; see :mod:`cmdare.measure.lifetime_markets`.
    """

    cloud: str
    region: str
    gpu: str | None
    role: str
    machine_type: str
    gpus_per_server: int
    vcpus: int
    on_demand_usd_per_h: float | None
    spot_usd_per_h: float | None
    source: str
    as_of: str
    accelerator: str | None = None
    zones: tuple[str, ...] = ()
    spot_only: bool = False
    retired: bool = False
    note: str = ""
    market: str = "spot"
    lifetime: str = "exponential"
    interruption_rate: str | None = None
    interruption_source: str = ""
    interruption_as_of: str = ""
    lifetime_shape: float | None = None

    @property
    def key(self) -> tuple[str, str, str | None, str]:
        """The merge key: ``(cloud, region, gpu, role)``."""
        return (self.cloud, self.region, self.gpu, self.role)

    def market_for(self, transient: bool) -> str:
        """The market a server of this offering is rented in: its transient market, or on-demand."""
        return self.market if transient else "on-demand"

    def server_price_per_hour_usd(self, transient: bool) -> float | None:
        """Price of the whole server, or ``None`` when this pricing model is not offered."""
        return self.spot_usd_per_h if transient else self.on_demand_usd_per_h

    def slot_price_per_hour_usd(self, transient: bool) -> float | None:
        """Price of one worker slot (one GPU and its share of the host); the server price for a PS."""
        price = self.server_price_per_hour_usd(transient)
        if price is None:
            return None
        return price / self.gpus_per_server if self.gpus_per_server > 1 else price

    def to_dict(self) -> dict[str, Any]:
        """A plain dictionary (for JSON output)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["zones"] = list(self.zones)
        return out


@dataclass(frozen=True)
class Catalog:
    """GPU types and server offerings, with price look-ups by GPU, cloud, region and pricing model."""

    gpus: Mapping[str, GpuType]
    offerings: tuple[Offering, ...]
    reference_rates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    # ---------------------------------------------------------------- look-ups
    def gpu_names(self) -> list[str]:
        """The GPU type names, in catalog order."""
        return list(self.gpus)

    def gpu(self, name: str) -> GpuType:
        """The GPU type called ``name`` (case-insensitive).

        Raises:
            UnknownNameError: no such GPU type; the message lists the valid ones.
        """
        key = _canonical_gpu(name, self.gpus)
        return self.gpus[key]

    def clouds(self) -> list[str]:
        """Clouds with at least one offering."""
        return sorted({o.cloud for o in self.offerings})

    def regions(self, cloud: str) -> list[str]:
        """Regions of ``cloud`` with at least one offering.

        Raises:
            UnknownNameError: ``cloud`` is not a known cloud.
        """
        cloud = _canonical_cloud(cloud)
        return sorted({o.region for o in self.offerings if o.cloud == cloud})

    def find(
        self, gpu: str | None = None, cloud: str | None = None, region: str | None = None,
        role: str | None = None, include_retired: bool = True,
    ) -> list[Offering]:
        """Offerings matching every given filter (``gpu`` is case-insensitive; ``'cpu'`` means no GPU)."""
        want_gpu = _MISSING if gpu is None else _gpu_key(gpu, self.gpus)
        want_cloud = _canonical_cloud(cloud) if cloud is not None else None
        return [
            o for o in self.offerings
            if (want_gpu is _MISSING or o.gpu == want_gpu)
            and (want_cloud is None or o.cloud == want_cloud)
            and (region is None or o.region == region)
            and (role is None or o.role == role)
            and (include_retired or not o.retired)
        ]

    def offering(self, gpu: str | None, cloud: str, region: str, role: str | None = None) -> Offering:
        """The offering of ``gpu`` (``None``: a CPU-only PS server) in ``cloud``/``region``.

        Raises:
            UnknownNameError: unknown GPU, cloud or region, or the GPU is not offered in that region
                (the message lists the regions that offer it, or the clouds if none of this cloud's do).
        """
        cloud = _canonical_cloud(cloud)
        gpu_key = _gpu_key(gpu, self.gpus)
        role = role or ("ps" if gpu_key is None else "worker")
        all_regions = self.regions(cloud)
        if region not in all_regions:
            raise UnknownNameError(f"{cloud} region", region, all_regions)
        matches = [o for o in self.offerings if o.key == (cloud, region, gpu_key, role)]
        if matches:
            return matches[0]
        what = gpu_key or "CPU-only"
        offered = sorted({o.region for o in self.offerings if o.cloud == cloud and o.gpu == gpu_key})
        if not offered:
            clouds = sorted({o.cloud for o in self.offerings if o.gpu == gpu_key})
            raise NotOfferedError(f"{what} servers", cloud, clouds or ["(no cloud)"])
        raise NotOfferedError(f"{what} servers on {cloud}", region, offered)

    def price_per_hour_usd(self, gpu: str | None, cloud: str, region: str, transient: bool) -> float:
        """USD per hour of one worker slot with ``gpu`` (or of a CPU PS server when ``gpu`` is None).

        Raises:
            UnknownNameError: unknown GPU, cloud or region (see :meth:`offering`).
            UserInputError: the server is not offered (or has no recorded price) with that pricing model.
        """
        off = self.offering(gpu, cloud, region)
        price = off.slot_price_per_hour_usd(transient)
        if price is None:
            model = "spot/preemptible" if transient else "on-demand"
            raise UserInputError(f"no {model} price for {off.gpu or 'CPU'} servers in {cloud} {region} in the catalog")
        return price

    def server_spec(
        self, gpu: str | None, cloud: str, region: str, transient: bool, role: str | None = None
    ) -> ServerSpec:
        """A :class:`ServerSpec` priced from this catalog."""
        off = self.offering(gpu, cloud, region, role)
        price = self.price_per_hour_usd(off.gpu, off.cloud, off.region, transient)
        return ServerSpec(gpu_type=off.gpu, cloud=off.cloud, region=off.region, transient=transient,
                          price_per_hour_usd=price, role=off.role)

    def cheapest(self, gpu: str | None = None, transient: bool = True, cloud: str | None = None) -> ServerSpec:
        """The cheapest worker slot, optionally restricted to a GPU type and/or a cloud.

        With ``gpu=None`` every current GPU type competes (retired ones such as K80 only when asked for
        by name). Ties break by cloud, region and GPU name so the answer is deterministic.

        Raises:
            UnknownNameError: unknown GPU or cloud.
            UserInputError: nothing matches (e.g. no spot price recorded for that GPU).
        """
        candidates = self.find(gpu=gpu, cloud=cloud, role="worker", include_retired=gpu is not None)
        priced = [(o.slot_price_per_hour_usd(transient), o) for o in candidates]
        priced = [(p, o) for p, o in priced if p is not None]
        if not priced:
            model = "spot/preemptible" if transient else "on-demand"
            raise UserInputError(f"no {model} offering for gpu={gpu or 'any'} cloud={cloud or 'any'} in the catalog")
        price, best = min(priced, key=lambda po: (po[0], po[1].cloud, po[1].region, po[1].gpu or ""))
        return ServerSpec(gpu_type=best.gpu, cloud=best.cloud, region=best.region, transient=transient,
                          price_per_hour_usd=price, role=best.role)


_MISSING: Any = object()


def _canonical_cloud(cloud: str) -> str:
    key = str(cloud).strip().lower()
    if key not in CLOUDS:
        raise UnknownNameError("cloud", cloud, [c for c in CLOUDS if c != "local"])
    return key


def _canonical_gpu(name: str, gpus: Iterable[str]) -> str:
    names = list(gpus)
    by_lower = {n.lower(): n for n in names}
    key = str(name).strip().lower()
    if key not in by_lower:
        raise UnknownNameError("GPU type", name, names)
    return by_lower[key]


def _gpu_key(gpu: str | None, gpus: Iterable[str]) -> str | None:
    """The canonical GPU name, or ``None`` for a CPU-only server (``None``, ``'cpu'`` or ``'none'``)."""
    if gpu is None or gpu.strip().lower() in ("cpu", "none"):
        return None
    return _canonical_gpu(gpu, gpus)


#: AWS Spot Instance Advisor bands ("frequency of interruption" over the trailing month) and the
#: fraction per month cmdare takes for each: the band's middle; ">20%" is taken as 25%.
RATE_BANDS: dict[str, float] = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
_PER = {"month": 30 * 86400.0, "mo": 30 * 86400.0, "week": 7 * 86400.0, "wk": 7 * 86400.0, "day": 86400.0,
        "d": 86400.0, "hour": 3600.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*(?:/\s*([a-z]+))?\s*$", re.I)
MONTH_S = _PER["month"]


def parse_interruption_rate(text: str) -> tuple[float, float]:
    """``(fraction, period_s)`` of an interruption rate: ``"8%/month"``, ``"2%/day"``, ``"0.5%/h"``,
    ``"8%"`` (per month) or an AWS band name (``"<5%"``, ``"5-10%"``, ... ``">20%"``, per month).

    Raises:
        UserInputError: not a rate, or not below 100% per period.
    """
    key = str(text).strip().replace(" ", "").replace("\u2013", "-").lower()
    if key in RATE_BANDS:
        return RATE_BANDS[key], MONTH_S
    m = _RATE.match(str(text))
    per = (m.group(2) or "month").lower() if m else ""
    if m is None or per not in _PER:
        raise UserInputError(f"cannot read interruption rate {text!r}: use e.g. 8%/month, 2%/day, or an AWS band "
                             f"({', '.join(RATE_BANDS)})")
    fraction = float(m.group(1)) / 100.0
    if not 0 < fraction < 1:
        raise UserInputError(f"interruption rate {text!r}: the fraction of servers interrupted per period must be "
                             "above 0% and below 100%")
    return fraction, _PER[per]
