"""Spot lifetime models fitted from preemption traces: shipped defaults and the user's own fits.

An *offering key* names what a fit covers: ``CLOUD:GPU`` or ``CLOUD:GPU:REGION`` (``aws:v100``,
``gcp:a100:us-east1``). :func:`fit_offering` reads traces (:mod:`cmdare.measure.spot_traces`), picks a model by
held-out likelihood (:mod:`cmdare.measure.survival`) and :func:`save_fit` stores it under the data directory's
``models/spot_lifetimes``. :func:`fitted_spot_lifetime` is what the catalog's spot markets ask first: the
user's fit for the offering's region, then for any region, then the shipped fits of the bundled traces
(``measure/data/spot_lifetime_fits.json``, made by :func:`fit_bundled`), else None (the catalog's
interruption-rate assumption stays).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from cmdare.errors import DataFormatError, UserInputError
from cmdare.measure.lifetime_models import EmpiricalLifetime, LifetimeModel, model_from_dict
from cmdare.measure.spot_traces import (
    BUNDLED_TRACES,
    DATA_DIR,
    ServerSpans,
    SpotTrace,
    capacity_gaps,
    load_bundled_trace,
    read_spot_trace,
)
from cmdare.measure.survival import FitResult, select_by_heldout
from cmdare.measure.weibull import SpotLifetime

__all__ = ["SHIPPED_FITS", "SpotFit", "all_fits", "check_offering", "fit_bundled", "fit_offering",
           "fitted_spot_lifetime", "offering_key", "parse_offering", "save_fit", "user_fits_dir"]

SHIPPED_FITS = Path(__file__).parent / "data" / "spot_lifetime_fits.json"
#: The bundled traces the shipped fits come from (the Parcae p3 trace repeats Bamboo's: not fitted twice).
SHIPPED_KEYS = ("aws:v100", "aws:t4", "gcp:a100:us-east1", "gcp:v100:us-east1")
_OFFERING = re.compile(r"^(aws|gcp):([a-z0-9]+)(?::([a-z0-9-]+))?$")


def parse_offering(text: str) -> tuple[str, str, str | None]:
    """``'aws:V100:us-east-1'`` -> ``('aws', 'v100', 'us-east-1')``; one-line error otherwise."""
    m = _OFFERING.match(str(text).strip().lower())
    if not m:
        raise UserInputError(f"--offering must be CLOUD:GPU[:REGION] with CLOUD aws or gcp (e.g. aws:v100 or "
                             f"gcp:a100:us-east1), got {text!r}")
    return m.group(1), m.group(2), m.group(3)


def check_offering(cloud: str, gpu: str, region: str | None = None) -> None:
    """Refuse an offering the catalog (``$CMDARE_CATALOG`` over the shipped one) does not have, in one line listing
    the valid GPU types or regions: a fit saved for it would never be asked for.

    Raises:
        UnknownNameError: an unknown GPU type, a GPU the cloud does not offer, or a region where it is not offered.
    """
    from cmdare.cloud.catalog import NotOfferedError, default_catalog

    catalog = default_catalog()
    name = catalog.gpu(gpu).name  # an unknown GPU type: the message lists the valid ones
    regions = sorted({o.region for o in catalog.find(gpu=name, cloud=cloud, role="worker")})
    if not regions:
        clouds = sorted({o.cloud for o in catalog.find(gpu=name, role="worker")})
        raise NotOfferedError(f"{name} servers", cloud, clouds or ["(no cloud)"])
    if region is not None and region not in regions:
        raise NotOfferedError(f"{name} servers on {cloud}", region, regions)


def offering_key(cloud: str, gpu: str, region: str | None = None) -> str:
    """``aws:v100`` or ``gcp:a100:us-east1``."""
    return ":".join(p for p in (cloud.lower(), gpu.lower(), (region or "").lower()) if p)


def user_fits_dir() -> Path:
    """Where ``cmdare models fit lifetimes`` keeps fits (the data directory's ``models/spot_lifetimes``)."""
    from cmdare.paths import models_dir, private_dir

    return private_dir(models_dir() / "spot_lifetimes")


def _merged(traces: Sequence[ServerSpans]) -> ServerSpans:
    """Several traces as one, each from its own start (server names prefixed by the trace's index)."""
    if len(traces) == 1:
        return traces[0]
    servers = {f"t{i}:{name}": spans for i, tr in enumerate(traces) for name, spans in tr.servers.items()}
    return ServerSpans(servers, max(t.horizon_s for t in traces), " + ".join(t.source for t in traces), "merged")


def _capacity(traces: Sequence[SpotTrace]) -> dict[str, list]:
    """Each lost server's wait until the count of servers held recovers (censored: never within the trace)."""
    gaps = [capacity_gaps(t) for t in traces]
    return {"gaps_s": [round(float(g), 3) for g, _ in gaps for g in g],
            "censored": [bool(c) for _, cs in gaps for c in cs]}


def fit_offering(paths: Sequence[str | Path], offering: str, fitted_on: str, order: str = "fifo") -> FitResult:
    """Fit the lifetimes of ``paths`` (read each from its start) for ``offering``, and keep the capacity gaps;
    ``fitted_on`` is the date to record (the caller's clock)."""
    if not paths:
        raise UserInputError("give at least one --trace FILE")
    cloud, gpu, region = parse_offering(offering)
    check_offering(cloud, gpu, region)
    traces = [read_spot_trace(p, order) for p in paths]
    for path, trace in zip(paths, traces, strict=True):
        if not trace.spans.horizon_s > trace.spans.observed_from_s:
            raise DataFormatError(f"{path}: every event is at {trace.spans.horizon_s:g} s: the trace spans no time, "
                                  "so it measures no lifetime")
    result = select_by_heldout(_merged([t.spans for t in traces]), fitted_on=fitted_on)
    result.meta.update(offering=offering_key(cloud, gpu, region), traces=[str(p) for p in paths], order=order,
                       capacity=_capacity(traces))
    return result


def save_fit(result: FitResult, directory: Path | None = None) -> Path:
    """Store a fit as ``<offering key>.json`` (``:`` as ``_``); returns the path."""
    path = _user_fit_path(result.meta["offering"], directory)
    path.write_text(json.dumps(result.to_dict(), indent=1, sort_keys=True))
    path.chmod(0o600)
    return path


def _user_fit_path(key: str, directory: Path | None = None) -> Path:
    """Where the user's fit of offering ``key`` is kept: ``aws_v100_us-east-1.json``."""
    return (directory or user_fits_dir()) / f"{key.replace(':', '_')}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise DataFormatError(f"{path}: not valid JSON") from None


@dataclass(frozen=True)
class SpotFit:
    """A fitted lifetime model for one offering, and what it rests on (for the catalog's ``basis``)."""

    key: str
    model: LifetimeModel
    chosen: str
    source: str
    fitted_on: str | None
    servers: int
    preemptions: int
    server_hours: float
    shipped: bool
    capacity_data: dict[str, Any] | None = field(default=None, repr=False)  # the trace's gaps, as stored

    @cached_property
    def capacity(self) -> LifetimeModel | None:
        """The wait for a replacement server: the Kaplan-Meier distribution of the trace's capacity gaps
        (built when the simulator first asks; None without any recovered gap)."""
        data = self.capacity_data
        if not data or not data.get("gaps_s"):
            return None
        gaps, censored = data["gaps_s"], data.get("censored") or [False] * len(data["gaps_s"])
        return None if all(censored) else EmpiricalLifetime().fit(gaps, censored)

    def basis(self) -> str:
        """``fitted on 167 preemptions in 273 server-hours (Bamboo ...), 2026-12-03`` and which key."""
        who = "bundled trace" if self.shipped else "your trace"
        return (f"fitted ({self.chosen}, held-out likelihood) on {self.preemptions} preemptions of {self.servers} "
                f"servers in {self.server_hours:.0f} server-hours, {who} {self.source} ({self.key}), "
                f"fitted {self.fitted_on or 'undated'}; no deadline")


def _model(data: dict[str, Any]) -> LifetimeModel:
    """A saved model: the shared registry's, or a Weibull (the spot markets' own model)."""
    if isinstance(data, dict) and data.get("model") == "weibull":
        return SpotLifetime(**data.get("params", {}))
    return model_from_dict(data)


def _spot_fit(key: str, data: dict[str, Any], shipped: bool, where: str) -> SpotFit:
    try:
        return SpotFit(key, _model(data["model"]), str(data["chosen"]), str(data["source"]),
                       data.get("fitted_on"), int(data["servers"]), int(data["preemptions"]),
                       float(data["server_hours"]), shipped, data.get("capacity"))
    except (KeyError, TypeError, ValueError) as err:
        raise DataFormatError(f"{where}: not a spot lifetime fit ({err})") from None


@lru_cache(maxsize=1)
def _shipped() -> dict[str, dict[str, Any]]:
    """The shipped fits (read once: every catalog offering asks)."""
    return json.loads(SHIPPED_FITS.read_text()) if SHIPPED_FITS.exists() else {}


def fitted_spot_lifetime(cloud: str, gpu: str, region: str | None = None) -> SpotFit | None:
    """The fit for a spot offering: the user's (this region, then any), then the shipped ones; None: none."""
    keys = [offering_key(cloud, gpu, region)] if region else []
    keys.append(offering_key(cloud, gpu))
    for key in keys:
        path = _user_fit_path(key)
        if path.exists():
            return _spot_fit(key, _read_json(path), False, str(path))
    shipped = _shipped()
    prefix = offering_key(cloud, gpu)
    for key in [*keys, *sorted(k for k in shipped if k.startswith(prefix + ":"))]:
        if key in shipped:
            return _spot_fit(key, shipped[key], True, str(SHIPPED_FITS))
    return None


def all_fits() -> list[tuple[SpotFit, list[Path]]]:
    """Every fit with the trace files it was fitted on: the shipped ones, then the user's."""
    out = [(_spot_fit(key, data, True, str(SHIPPED_FITS)), [DATA_DIR / t for t in data.get("traces", [])])
           for key, data in _shipped().items()]
    for path in sorted(user_fits_dir().glob("*.json")):
        data = _read_json(path)
        out.append((_spot_fit(str(data.get("offering", path.stem)), data, False, str(path)),
                    [Path(t) for t in data.get("traces", [])]))
    return out


def fit_bundled(fitted_on: str) -> dict[str, dict[str, Any]]:
    """Fit every shipped trace of :data:`SHIPPED_KEYS` (the content of :data:`SHIPPED_FITS`)."""
    out = {}
    for key in SHIPPED_KEYS:
        trace = load_bundled_trace(key)
        result = select_by_heldout(trace.spans, fitted_on=fitted_on)
        info = BUNDLED_TRACES[key]
        result.meta.update(offering=key, traces=[info.file], citation=info.citation, describes=info.offering,
                           capacity=_capacity([trace]))
        result.source = info.file
        out[key] = result.to_dict()
    return out
