"""Time-of-day-aware lifetime models: does the hour at which a transient server is launched change
how long it lives?

A :class:`TimeOfDayLifetime` holds one lifetime model per launch-hour bucket (``bucket_hours`` wide,
4 buckets of 6 h by default) where the bucket has at least ``min_vms`` observed servers and (unless
``max_p`` is None) its lifetimes differ from the rest of the type's (two-sample KS p-value below
``max_p``), and the pooled (hour-agnostic) model of the server type for every other bucket: a bucket
model is fitted only where the data shows the hour matters, not to the noise of 30 servers. :func:`time_of_day_stats`
measures whether the split matters: per bucket the size, median and (restricted) mean lifetime, the
fraction revoked before the 24 h deadline and a two-sample Kolmogorov-Smirnov test of the bucket
against the rest of the same server type.

Clock: launch hours are read in US Pacific time, the zone GCE's API reports operation times in (the
HPDC 2020 preemption JSON carries them as ``...-07:00`` / ``-08:00``). The ICAC 2019 GPU sheet
records bare ``2/18/19 23:40`` times; we take them in that same clock (the importer stores them as if
UTC, so their wall-clock hour is read back unchanged). See ``docs/planner.md``.

Defaults per model name and server type are fitted on the shared public data and shipped as
``measure/data/lifetime_tod_defaults.json``; regenerate with ``python -m cmdare.measure.lifetime_tod
--write`` (the pooled model of each type is copied from ``lifetime_defaults.json``, so an
hour-agnostic bucket samples exactly what the hour-agnostic planner samples).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np

from cmdare.errors import DataNotFoundError, UnknownNameError, UserInputError
from cmdare.measure.lifetime_models import (
    DEADLINE_S,
    LIFETIME_MODELS,
    LifetimeModel,
    empirical_cdf,
    load_defaults,
    make_lifetime_model,
    model_from_dict,
)

__all__ = [
    "DATA_CLOCK",
    "MIN_VMS_PER_BUCKET",
    "TOD_DEFAULTS_PATH",
    "TimeOfDayLifetime",
    "bucket_of",
    "build_tod_defaults",
    "clock_hour",
    "load_tod_defaults",
    "load_tod_model",
    "time_of_day_stats",
]

TOD_DEFAULTS_PATH = Path(__file__).parent / "data" / "lifetime_tod_defaults.json"
#: The clock launch hours are read in (see the module docstring).
DATA_CLOCK = "America/Los_Angeles"
#: A bucket gets its own model only with at least this many servers; below, the pooled model applies.
MIN_VMS_PER_BUCKET = 30
#: ... and only if it differs from the rest of its type at this significance (two-sample KS test).
MAX_P = 0.05
BUCKET_HOURS = 6
#: Sources whose timestamps are bare wall-clock times stored as if UTC (the ICAC 2019 GPU sheet).
_NAIVE_SOURCES = ("icac2019-gce-gpu",)


def _check_bucket_hours(bucket_hours: int) -> int:
    if not isinstance(bucket_hours, int) or bucket_hours < 1 or 24 % bucket_hours:
        raise UserInputError(f"bucket_hours must divide 24 (1, 2, 3, 4, 6, 8, 12, 24), got {bucket_hours}")
    return bucket_hours


def bucket_of(hour: float, bucket_hours: int = BUCKET_HOURS) -> int:
    """Bucket index of a launch hour of day (``0 <= hour < 24``; later hours wrap round the clock)."""
    return int((float(hour) % 24.0) // bucket_hours)


def bucket_label(bucket: int, bucket_hours: int = BUCKET_HOURS) -> str:
    """``"18-24 h"`` for bucket 3 of 6 h."""
    return f"{bucket * bucket_hours:02d}-{(bucket + 1) * bucket_hours:02d} h"


def clock_hour(observation: dict[str, Any]) -> float | None:
    """Launch hour of day (fractional) of an imported lifetime observation in :data:`DATA_CLOCK`.

    Returns None when the observation has no start time.
    """
    start = observation.get("start")
    if start is None:
        return None
    when = datetime.fromtimestamp(float(start), UTC)
    if observation.get("source") not in _NAIVE_SOURCES:
        when = when.astimezone(ZoneInfo(DATA_CLOCK))
    return when.hour + when.minute / 60.0 + when.second / 3600.0


class TimeOfDayLifetime:
    """A lifetime model per launch-hour bucket, with the pooled model where a bucket has too few VMs.

    Args:
        pooled: the hour-agnostic model of the server type (used by every bucket without its own).
        buckets: bucket index -> fitted model, for the buckets with enough observations.
        bucket_hours: bucket width in hours (divides 24).
        min_vms: the minimum observations a bucket needed to get its own model (recorded for reports).
    """

    name = "tod"

    def __init__(
        self,
        pooled: LifetimeModel,
        buckets: dict[int, LifetimeModel] | None = None,
        bucket_hours: int = BUCKET_HOURS,
        min_vms: int = MIN_VMS_PER_BUCKET,
    ):
        self.bucket_hours = _check_bucket_hours(bucket_hours)
        self.n_buckets = 24 // self.bucket_hours
        self.pooled = pooled
        self.buckets = dict(buckets or {})
        for b in self.buckets:
            if not 0 <= b < self.n_buckets:
                raise UserInputError(f"bucket {b} out of range 0..{self.n_buckets - 1} for {bucket_hours} h buckets")
        self.min_vms = min_vms
        self.meta: dict[str, Any] = {}

    @classmethod
    def fit(
        cls,
        base: str,
        lifetimes_s: Any,
        launch_hours: Any,
        censored: Any = None,
        bucket_hours: int = BUCKET_HOURS,
        min_vms: int = MIN_VMS_PER_BUCKET,
        pooled: LifetimeModel | None = None,
        max_p: float | None = MAX_P,
        p_values: dict[int, float] | None = None,
    ) -> TimeOfDayLifetime:
        """Fit ``base`` (a registry name: exponential, bathtub, empirical) per bucket with ``min_vms``
        servers or more whose KS p-value against the rest is below ``max_p`` (None: no test), and
        pooled on all of them unless ``pooled`` is given.

        Args:
            p_values: precomputed bucket -> p-value (from :func:`time_of_day_stats`); computed if None.
        """
        t = np.asarray(lifetimes_s, dtype=float).ravel()
        hours = np.asarray(launch_hours, dtype=float).ravel()
        cens = np.zeros(t.size, bool) if censored is None else np.asarray(censored, dtype=bool).ravel()
        if hours.size != t.size or cens.size != t.size:
            raise UserInputError(f"{t.size} lifetimes but {hours.size} launch hours and {cens.size} censor flags")
        _check_bucket_hours(bucket_hours)
        if pooled is None:
            pooled = make_lifetime_model(base).fit(t, cens)
            pooled.meta = {"n": int(t.size)}
        idx = (np.mod(hours, 24.0) // bucket_hours).astype(int)
        if max_p is not None and p_values is None:
            rows = time_of_day_stats(t, hours, cens, bucket_hours)
            p_values = {r["bucket"]: r["ks_p"] for r in rows if r.get("ks_p") is not None}
        models: dict[int, LifetimeModel] = {}
        counts: dict[str, int] = {}
        for b in range(24 // bucket_hours):
            sel = idx == b
            counts[str(b)] = int(sel.sum())
            p = None if p_values is None else p_values.get(b)
            differs = max_p is None or (p is not None and p < max_p)
            if sel.sum() >= min_vms and differs:
                m = make_lifetime_model(base).fit(t[sel], cens[sel])
                m.meta = {"n": int(sel.sum()), "hours": bucket_label(b, bucket_hours)}
                if p is not None:
                    m.meta["ks_p_vs_rest"] = p
                models[b] = m
        out = cls(pooled, models, bucket_hours, min_vms)
        out.meta = {"n_per_bucket": counts, "clock": DATA_CLOCK, "max_p": max_p}
        return out

    def bucket_of(self, hour: float) -> int:
        """Bucket index of a launch hour of day."""
        return bucket_of(hour, self.bucket_hours)

    def model_at(self, launch_hour: float | None) -> LifetimeModel:
        """The model for servers launched at ``launch_hour`` (None: the pooled model)."""
        if launch_hour is None:
            return self.pooled
        return self.buckets.get(self.bucket_of(launch_hour), self.pooled)

    def cdf(self, t_s: Any, launch_hour: float | None = None) -> np.ndarray:
        """Probability that a server launched at ``launch_hour`` is revoked by ``t_s`` seconds."""
        return self.model_at(launch_hour).cdf(t_s)

    def sample(
        self, rng: np.random.Generator, size: int | tuple[int, ...], launch_hour: float | None = None
    ) -> np.ndarray:
        """Lifetimes (s) of servers launched at ``launch_hour`` (None: pooled)."""
        return self.model_at(launch_hour).sample(rng, size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``{"model": "tod", "bucket_hours", "min_vms", "pooled", "buckets": {i: model}}``."""
        return {
            "model": self.name,
            "bucket_hours": self.bucket_hours,
            "min_vms": self.min_vms,
            "pooled": self.pooled.to_dict(),
            "buckets": {str(b): m.to_dict() for b, m in sorted(self.buckets.items())},
            **({"meta": self.meta} if self.meta else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimeOfDayLifetime:
        """Rebuild a model saved with :meth:`to_dict`.

        Raises:
            DataFormatError: not a saved time-of-day model.
        """
        from cmdare.errors import DataFormatError

        if not isinstance(data, dict) or data.get("model") != cls.name or "pooled" not in data:
            raise DataFormatError("a saved time-of-day lifetime model is a JSON object with model 'tod' and 'pooled'")
        try:
            buckets = {int(b): model_from_dict(m) for b, m in (data.get("buckets") or {}).items()}
        except ValueError as err:
            raise DataFormatError(f"bad bucket index in a time-of-day lifetime model: {err}") from err
        out = cls(
            model_from_dict(data["pooled"]),
            buckets,
            int(data.get("bucket_hours", BUCKET_HOURS)),
            int(data.get("min_vms", MIN_VMS_PER_BUCKET)),
        )
        out.meta = dict(data.get("meta") or {})
        return out


def _km_summary(t: np.ndarray, cens: np.ndarray) -> tuple[float, float, float]:
    """(median s, restricted mean s, F just before the 24 h deadline) from the Kaplan-Meier curve."""
    times, f = empirical_cdf(t, cens)
    reach = np.nonzero(f >= 0.5)[0]
    median = float(times[reach[0]]) if reach.size else float("nan")
    surv = 1.0 - f
    # Restricted mean: area under the survival curve up to the longest lifetime (the sample mean
    # when nothing is censored).
    edges = np.concatenate([[0.0], times])
    mean = float(np.sum(np.concatenate([[1.0], surv[:-1]]) * np.diff(edges)))
    idx = np.searchsorted(times, DEADLINE_S, side="left") - 1
    before = float(f[idx]) if idx >= 0 else 0.0
    return median, mean, before


def _km_sup_distance(t: np.ndarray, cens: np.ndarray, a: np.ndarray) -> float:
    grid = np.unique(t)
    out = []
    for sel in (a, ~a):
        times, f = empirical_cdf(t[sel], cens[sel])
        idx = np.searchsorted(times, grid, side="right") - 1
        out.append(np.where(idx >= 0, f[np.clip(idx, 0, None)], 0.0))
    return float(np.max(np.abs(out[0] - out[1])))


def _two_sample_ks(
    t: np.ndarray, cens: np.ndarray, in_bucket: np.ndarray, permutations: int, seed: int
) -> tuple[float, float]:
    """KS statistic and p-value of bucket vs rest: scipy's exact/asymptotic test without censoring,
    else a permutation test of the sup distance between the two Kaplan-Meier CDFs."""
    if not cens.any():
        from scipy.stats import ks_2samp

        res = ks_2samp(t[in_bucket], t[~in_bucket])
        return float(res.statistic), float(res.pvalue)
    observed = _km_sup_distance(t, cens, in_bucket)
    rng = np.random.default_rng(seed)
    hits = sum(_km_sup_distance(t, cens, rng.permutation(in_bucket)) >= observed - 1e-12 for _ in range(permutations))
    return observed, float((hits + 1) / (permutations + 1))


def time_of_day_stats(
    lifetimes_s: Any,
    launch_hours: Any,
    censored: Any = None,
    bucket_hours: int = BUCKET_HOURS,
    permutations: int = 999,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Per launch-hour bucket: n, revoked, median and mean lifetime (h), fraction revoked before 24 h,
    and the two-sample KS statistic and p-value of the bucket against all other buckets.

    Empty buckets are listed with n=0; the KS test needs both sides non-empty (else None).
    """
    t = np.asarray(lifetimes_s, dtype=float).ravel()
    hours = np.asarray(launch_hours, dtype=float).ravel()
    cens = np.zeros(t.size, bool) if censored is None else np.asarray(censored, dtype=bool).ravel()
    idx = (np.mod(hours, 24.0) // _check_bucket_hours(bucket_hours)).astype(int)
    rows = []
    for b in range(24 // bucket_hours):
        sel = idx == b
        row: dict[str, Any] = {"bucket": b, "hours": bucket_label(b, bucket_hours), "n": int(sel.sum())}
        if sel.any():
            median, mean, before = _km_summary(t[sel], cens[sel])
            row.update(
                revoked=int((~cens[sel]).sum()),
                median_h=round(median / 3600, 3),
                mean_h=round(mean / 3600, 3),
                revoked_before_24h=round(before, 3),
            )
            if (~sel).any():
                ks, p = _two_sample_ks(t, cens, sel, permutations, seed)
                row.update(ks=round(ks, 4), ks_p=float(f"{p:.4g}"), vs_n=int((~sel).sum()))
        rows.append(row)
    return rows


# ---- defaults shipped with the package ---------------------------------------------------------


def _observations(gpu_csv: Path | None, cpu_json: Path | None) -> dict[str, list[dict[str, Any]]]:
    """Typed observations with a launch hour, per server type (k80, p100, v100, cpu)."""
    from cmdare.measure.importers.lifetimes import read_lifetimes_file

    out: dict[str, list[dict[str, Any]]] = {}
    for path in (p for p in (gpu_csv, cpu_json) if p is not None):
        for o in read_lifetimes_file(path).rows.get("lifetime_observations", []):
            if o["server_type"] in ("k80", "p100", "v100", "cpu"):
                hour = clock_hour(o)
                if hour is not None:
                    out.setdefault(o["server_type"], []).append({**o, "launch_hour": hour})
    return out


def build_tod_defaults(
    gpu_csv: Path | None, cpu_json: Path | None = None, bucket_hours: int = BUCKET_HOURS,
    min_vms: int = MIN_VMS_PER_BUCKET,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Fit every registered model per bucket and server type on the public data.

    Returns:
        ``(defaults, stats)``: ``{name: {type: tod_dict}}`` and ``{type: time_of_day_stats rows}``.
    """
    obs = _observations(gpu_csv, cpu_json)
    pooled_defaults = load_defaults()
    defaults: dict[str, dict[str, Any]] = {name: {} for name in LIFETIME_MODELS}
    stats: dict[str, list[dict[str, Any]]] = {}
    for stype, rows in sorted(obs.items()):
        t = np.array([r["lifetime_s"] for r in rows])
        hours = np.array([r["launch_hour"] for r in rows])
        cens = np.array([not r["preempted"] for r in rows])
        stats[stype] = time_of_day_stats(t, hours, cens, bucket_hours)
        for name in LIFETIME_MODELS:
            pooled_dict = pooled_defaults.get(name, {}).get(stype)
            pooled = model_from_dict(pooled_dict) if pooled_dict else None
            p_values = {r["bucket"]: r["ks_p"] for r in stats[stype] if r.get("ks_p") is not None}
            model = TimeOfDayLifetime.fit(name, t, hours, cens, bucket_hours, min_vms, pooled, MAX_P, p_values)
            model.meta["source"] = sorted({r["source"] for r in rows})
            defaults[name][stype] = model.to_dict()
    return defaults, stats


def load_tod_defaults() -> dict[str, dict[str, Any]]:
    """The shipped time-of-day models: ``{name: {server_type: tod_dict}}``."""
    if not TOD_DEFAULTS_PATH.exists():
        raise DataNotFoundError(f"default time-of-day lifetime models missing: {TOD_DEFAULTS_PATH}")
    return json.loads(TOD_DEFAULTS_PATH.read_text())


def load_tod_model(spec: str) -> TimeOfDayLifetime:
    """The shipped time-of-day model for ``"name:server_type"`` (e.g. ``"bathtub:k80"``).

    Raises:
        UnknownNameError: unknown model name, or no time-of-day model for that server type.
    """
    name, _, key = spec.partition(":")
    if name not in LIFETIME_MODELS:
        raise UnknownNameError("lifetime model", name, LIFETIME_MODELS)
    fitted = load_tod_defaults().get(name, {})
    if key.lower() not in fitted:
        raise UnknownNameError(f"server type for time-of-day lifetime model {name!r}", key, sorted(fitted))
    return TimeOfDayLifetime.from_dict(fitted[key.lower()])


def main(argv: list[str] | None = None) -> None:
    """Print the time-of-day statistics of the public data; ``--write`` also refits the defaults."""
    import argparse

    from cmdare.public_data import lifetime_files

    parser = argparse.ArgumentParser(description=main.__doc__)
    gpu_csv, cpu_json = lifetime_files()  # the bundled public data, or $CMDARE_SHARED_DATA
    parser.add_argument("--gpu-csv", type=Path, default=gpu_csv)
    parser.add_argument("--cpu-json", type=Path, default=cpu_json)
    parser.add_argument("--write", action="store_true", help=f"write {TOD_DEFAULTS_PATH.name}")
    args = parser.parse_args(argv)
    defaults, stats = build_tod_defaults(args.gpu_csv, args.cpu_json)
    print(json.dumps(stats, indent=1))
    if args.write:
        TOD_DEFAULTS_PATH.write_text(json.dumps(defaults, separators=(",", ":")) + "\n")
        print(f"wrote {TOD_DEFAULTS_PATH}")


if __name__ == "__main__":
    main()
