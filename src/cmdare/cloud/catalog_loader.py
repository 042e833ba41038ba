"""Loading the server catalog: the shipped defaults merged with a user file, validated entry by entry.

The defaults ship as ``cmdare/cloud/data/catalog.yaml`` (every price names its source and date). A
user file - ``load_catalog(path)``, the ``CMDARE_CATALOG`` environment variable or ``--catalog FILE`` -
is merged over the defaults: GPU types by name (field by field), offerings by
``(cloud, region, gpu, role)`` (field by field), so a one-line override can change one spot price.
A file name without a path that matches a shipped override (``icac2019``) loads that override.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from cmdare.cloud.catalog_model import LIFETIMES, MARKETS, Catalog, GpuType, Offering, parse_interruption_rate
from cmdare.cloud.servers import CLOUDS, ROLES
from cmdare.errors import DataFormatError, DataNotFoundError, UserInputError

__all__ = ["CATALOG_ENV", "builtin_catalog_path", "default_catalog", "gpu_tflops", "load_catalog"]

CATALOG_ENV = "CMDARE_CATALOG"
_DATA_DIR = Path(__file__).parent / "data"
_DEFAULT_FILE = _DATA_DIR / "catalog.yaml"
_TOP_KEYS = {"schema_version", "gpus", "offerings", "reference_rates"}
_GPU_KEYS = {"tflops_fp32", "memory_gb", "source"}
_OFFERING_KEYS = {
    "cloud", "region", "gpu", "role", "machine_type", "accelerator", "gpus_per_server", "vcpus", "zones",
    "on_demand_usd_per_h", "spot_usd_per_h", "spot_only", "retired", "source", "as_of", "note",
    "market", "lifetime", "interruption_rate", "interruption_source", "interruption_as_of", "lifetime_shape",
}
#: The lifetime model a market gets when an offering does not name one.
_DEFAULT_LIFETIME = {"preemptible": "bathtub", "spot": "exponential", "on-demand": "none"}


def builtin_catalog_path(name: str) -> Path | None:
    """Path of a shipped override called ``name`` (e.g. ``'icac2019'``), or ``None``."""
    if not name or "/" in name or os.sep in name or name.endswith((".yaml", ".yml", ".json")):
        return None
    path = _DATA_DIR / f"{name}.yaml"
    return path if path.is_file() and path != _DEFAULT_FILE else None


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DataNotFoundError(f"catalog file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise DataFormatError(f"catalog {path}: cannot parse as YAML/JSON: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DataFormatError(f"catalog {path}: top level must be a mapping with 'gpus' and/or 'offerings'")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise DataFormatError(f"catalog {path}: unknown top-level key(s) {sorted(unknown)}; valid: {sorted(_TOP_KEYS)}")
    return data


def _number(where: str, fname: str, value: Any, *, allow_none: bool = False, positive: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataFormatError(f"{where}: field '{fname}' must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise DataFormatError(f"{where}: field '{fname}' must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _text(where: str, fname: str, value: Any, *, allow_empty: bool = False) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # e.g. as_of: 2019
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise DataFormatError(f"{where}: field '{fname}' must be a non-empty string, got {value!r}")
    return value


def _merge_gpus(base: dict[str, dict], raw: Any, origin: str) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise DataFormatError(f"catalog {origin}: 'gpus' must be a mapping of GPU name to fields")
    lower = {n.lower(): n for n in base}
    for name, fields in raw.items():
        where = f"catalog {origin}: GPU {name!r}"
        if not isinstance(name, str) or not name.strip():
            raise DataFormatError(f"catalog {origin}: GPU names must be non-empty strings, got {name!r}")
        if not isinstance(fields, dict):
            raise DataFormatError(f"{where}: must be a mapping with {sorted(_GPU_KEYS)}")
        unknown = set(fields) - _GPU_KEYS
        if unknown:
            raise DataFormatError(f"{where}: unknown field(s) {sorted(unknown)}; valid: {sorted(_GPU_KEYS)}")
        key = lower.get(name.lower(), name)
        merged = {**base.get(key, {}), **fields}
        for req in sorted(_GPU_KEYS):
            if req not in merged:
                raise DataFormatError(f"{where}: missing field '{req}'")
        _number(where, "tflops_fp32", merged["tflops_fp32"], positive=True)
        _number(where, "memory_gb", merged["memory_gb"], positive=True)
        _text(where, "source", merged["source"])
        base[key] = merged
        lower[key.lower()] = key


def _offering_key(raw: dict, where: str, gpus: dict[str, dict]) -> tuple[str, str, str | None, str]:
    for req in ("cloud", "region"):
        if req not in raw:
            raise DataFormatError(f"{where}: missing field '{req}'")
    cloud = _text(where, "cloud", raw["cloud"]).strip().lower()
    if cloud not in CLOUDS:
        raise DataFormatError(f"{where}: field 'cloud' must be one of {list(CLOUDS)}, got {raw['cloud']!r}")
    region = _text(where, "region", raw["region"]).strip()
    gpu = raw.get("gpu")
    if gpu is not None:
        gpu_name = _text(where, "gpu", gpu)
        lower = {n.lower(): n for n in gpus}
        if gpu_name.lower() not in lower:
            raise DataFormatError(f"{where}: field 'gpu' names unknown GPU type {gpu_name!r}; "
                                  f"known: {', '.join(gpus)} (add it under 'gpus')")
        gpu = lower[gpu_name.lower()]
    role = raw.get("role") or ("ps" if gpu is None else "worker")
    if role not in ROLES:
        raise DataFormatError(f"{where}: field 'role' must be one of {list(ROLES)}, got {role!r}")
    return (cloud, region, gpu, role)


def _merge_offerings(base: dict[tuple, dict], raw: Any, origin: str, gpus: dict[str, dict]) -> None:
    if raw is None:
        return
    if not isinstance(raw, list):
        raise DataFormatError(f"catalog {origin}: 'offerings' must be a list of mappings")
    for i, entry in enumerate(raw):
        where = f"catalog {origin}: offering #{i + 1}"
        if not isinstance(entry, dict):
            raise DataFormatError(f"{where}: must be a mapping, got {entry!r}")
        unknown = set(entry) - _OFFERING_KEYS
        if unknown:
            raise DataFormatError(f"{where}: unknown field(s) {sorted(unknown)}; valid: {sorted(_OFFERING_KEYS)}")
        key = _offering_key(entry, where, gpus)
        where = f"{where} ({key[0]}/{key[1]}/{key[2] or 'cpu'}/{key[3]})"
        merged = {**base.get(key, {}), **entry, "cloud": key[0], "region": key[1], "gpu": key[2], "role": key[3]}
        merged["__where__"] = where
        base[key] = merged


def _build_offering(raw: dict) -> Offering:
    where = raw.pop("__where__")
    for req in ("machine_type", "source", "as_of"):
        if req not in raw:
            raise DataFormatError(f"{where}: missing field '{req}'")
    od = _number(where, "on_demand_usd_per_h", raw.get("on_demand_usd_per_h"), allow_none=True)
    spot = _number(where, "spot_usd_per_h", raw.get("spot_usd_per_h"), allow_none=True)
    if od is None and spot is None:
        raise DataFormatError(f"{where}: needs 'on_demand_usd_per_h' and/or 'spot_usd_per_h'")
    default_gpus = 0 if raw["gpu"] is None else 1
    gps = raw.get("gpus_per_server", default_gpus)
    if isinstance(gps, bool) or not isinstance(gps, int) or gps < 0 or (raw["gpu"] is not None and gps < 1):
        raise DataFormatError(f"{where}: field 'gpus_per_server' must be a whole number (>= 1 for a GPU server), "
                              f"got {gps!r}")
    vcpus = raw.get("vcpus", 4)
    if isinstance(vcpus, bool) or not isinstance(vcpus, int) or vcpus < 1:
        raise DataFormatError(f"{where}: field 'vcpus' must be a whole number >= 1, got {vcpus!r}")
    zones = raw.get("zones") or []
    if not isinstance(zones, list) or not all(isinstance(z, str) and z for z in zones):
        raise DataFormatError(f"{where}: field 'zones' must be a list of zone names, got {zones!r}")
    for flag in ("spot_only", "retired"):
        if not isinstance(raw.get(flag, False), bool):
            raise DataFormatError(f"{where}: field '{flag}' must be true or false, got {raw[flag]!r}")
    accelerator = raw.get("accelerator")
    market, lifetime, rate, shape = _market(where, raw, spot)
    return Offering(
        cloud=raw["cloud"], region=raw["region"], gpu=raw["gpu"], role=raw["role"],
        machine_type=_text(where, "machine_type", raw["machine_type"]),
        gpus_per_server=gps, vcpus=vcpus, on_demand_usd_per_h=od, spot_usd_per_h=spot,
        source=_text(where, "source", raw["source"]), as_of=_text(where, "as_of", raw["as_of"]),
        accelerator=_text(where, "accelerator", accelerator) if accelerator is not None else None,
        zones=tuple(zones), spot_only=raw.get("spot_only", False), retired=raw.get("retired", False),
        note=_text(where, "note", raw.get("note", ""), allow_empty=True),
        market=market, lifetime=lifetime, interruption_rate=rate, lifetime_shape=shape,
        interruption_source=_text(where, "interruption_source", raw.get("interruption_source", ""), allow_empty=True),
        interruption_as_of=_text(where, "interruption_as_of", raw.get("interruption_as_of", ""), allow_empty=True),
    )


def _market(where: str, raw: dict, spot: float | None) -> tuple[str, str, str | None, float | None]:
    """(market, lifetime model, interruption rate, Weibull shape) of an offering, validated."""
    market = raw.get("market") or ("on-demand" if spot is None else "spot")
    if market not in MARKETS:
        raise DataFormatError(f"{where}: field 'market' must be one of {list(MARKETS)}, got {market!r}")
    if (market == "on-demand") != (spot is None):
        raise DataFormatError(f"{where}: market {market!r} " + ("has no 'spot_usd_per_h'" if spot is None else
                              "has a 'spot_usd_per_h': set market to spot or preemptible"))
    lifetime = raw.get("lifetime") or _DEFAULT_LIFETIME[market]
    if lifetime not in LIFETIMES:
        raise DataFormatError(f"{where}: field 'lifetime' must be one of {list(LIFETIMES)}, got {lifetime!r}")
    if (lifetime == "none") != (market == "on-demand"):
        raise DataFormatError(f"{where}: lifetime {lifetime!r} does not fit market {market!r}")
    rate = raw.get("interruption_rate")
    if rate is not None:
        try:
            parse_interruption_rate(_text(where, "interruption_rate", rate))
        except UserInputError as err:
            raise DataFormatError(f"{where}: field 'interruption_rate': {err}") from None
    shape = _number(where, "lifetime_shape", raw.get("lifetime_shape"), allow_none=True, positive=True)
    if lifetime == "weibull" and shape is None:
        raise DataFormatError(f"{where}: lifetime 'weibull' needs 'lifetime_shape' (the Weibull shape k > 0)")
    return market, lifetime, None if rate is None else str(rate), shape


def _resolve(path: str | os.PathLike[str]) -> Path:
    text = os.fspath(path)
    builtin = builtin_catalog_path(text)
    return builtin if builtin is not None and not Path(text).exists() else Path(text).expanduser()


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Load the shipped catalog, merged with a user file.

    Args:
        path: a YAML/JSON override file (or a shipped override name such as ``'icac2019'``). ``None``
            uses ``$CMDARE_CATALOG`` if set, else the defaults alone.

    Raises:
        DataNotFoundError: the user file does not exist.
        DataFormatError: the file cannot be parsed or an entry is malformed (the message names the
            entry and the field).
    """
    if path is None:
        path = os.environ.get(CATALOG_ENV) or None
    files = [_DEFAULT_FILE] + ([_resolve(path)] if path is not None else [])
    gpus: dict[str, dict] = {}
    offerings: dict[tuple, dict] = {}
    refs: dict[str, Any] = {}
    for file in files:
        data = _read(file)
        origin = file.name if file.parent == _DATA_DIR else str(file)
        _merge_gpus(gpus, data.get("gpus"), origin)
        _merge_offerings(offerings, data.get("offerings"), origin, gpus)
        extra_refs = data.get("reference_rates") or {}
        if not isinstance(extra_refs, dict):
            raise DataFormatError(f"catalog {origin}: 'reference_rates' must be a mapping")
        refs.update(extra_refs)
    gpu_types = {
        name: GpuType(name=name, tflops_fp32=float(f["tflops_fp32"]), memory_gb=float(f["memory_gb"]),
                      source=str(f["source"]))
        for name, f in gpus.items()
    }
    return Catalog(gpus=gpu_types, offerings=tuple(_build_offering(dict(raw)) for raw in offerings.values()),
                   reference_rates=refs, sources=tuple(str(f) for f in files))


@lru_cache(maxsize=8)
def _cached(path: str | None, mtime: float) -> Catalog:
    return load_catalog(path)


def default_catalog() -> Catalog:
    """The catalog ``load_catalog()`` returns, cached while ``$CMDARE_CATALOG`` and its file are unchanged."""
    path = os.environ.get(CATALOG_ENV) or None
    mtime = 0.0
    if path is not None:
        resolved = _resolve(path)
        mtime = resolved.stat().st_mtime if resolved.exists() else -1.0
    return _cached(path, mtime)


def gpu_tflops(name: str) -> float:
    """Peak FP32 TFLOPS of GPU type ``name`` (case-insensitive) from the default catalog.

    Raises:
        UnknownNameError: no such GPU type.
    """
    return default_catalog().gpu(name).tflops_fp32
