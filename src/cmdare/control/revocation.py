"""Revocation sources: when each transient server dies, in local emulation and in the simulator.

``--revocations`` takes a spec string:

* ``lifetime=NAME[,speedup=S][,seed=N]``: each transient server lives a lifetime drawn from the
  lifetime model ``NAME`` (``bathtub``, ``exponential``, ``empirical``, ``bathtub:k80``, a saved
  model file; see :mod:`cmdare.measure.lifetime_models`), divided by ``speedup`` (time compression:
  ``speedup=3600`` turns an hour into a second), counted from the moment its server is ready;
  ``lifetime=auto``: each server's catalog offering picks its market's model (GCE preemptible: the
  fitted bathtub; spot: a preemption trace's fit where one exists, else exponential at the interruption rate,
  :mod:`cmdare.measure.lifetime_markets`);
* ``every=S[,first=F]``: a transient server is revoked every ``S`` seconds (chaos tests);
* ``trace=T@SLOT+T@ps+...``: the worker in data slot ``SLOT`` (``ps``: the longest-serving transient PS
  server) is revoked ``T`` seconds after the first step (a scripted schedule: the same in the Ray trainer
  and the simulator); ``trace=FILE``
  (a value without ``@``) replays a revocation trace file - a CSV ``time_s,server,event`` or a
  Can't Be Late per-tick JSON, see :mod:`cmdare.measure.revocation_traces` - whose revocations hit
  a slot, the lowest live slot of a server type, or any transient worker; both divided by ``speedup``;
* ``none``: no injected revocations (notices and real failures are still handled).

Two keys shape any source:

* ``hit=all|workers|ps``: which transient servers injected revocations hit (default ``all``: the
  workers' and, with ``--ps-transient``, the parameter servers'; one stream over all of them);
* ``notice=S``: a parameter server's revocation comes ``S`` seconds after its notice (compressed
  time, like the lifetimes); default the cloud's own lead time (GCE 30 s, AWS 120 s) divided by
  ``speedup``; ``notice=0``: no notice. Injected worker revocations stay abrupt (a worker's notices
  come from the cloud's metadata or Ray's drain).

In a local (emulated) run every time above is *emulated cloud time*, which advances with training: each
global step moves it by one step of the emulated cluster (:mod:`cmdare.control.emulated_clock`). One more
key sets how long a step is:

* ``step=S``: every worker step lasts ``S`` emulated seconds, whatever its GPU type (default: the step-time
  model's prediction for the run's model on each worker's GPU type). With ``step=1`` and two workers, cloud
  time is the global step divided by two, so ``trace=50@0`` revokes slot 0 at step 100 on any machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cmdare.control.membership import WorkerInfo
from cmdare.control.registry import Registry
from cmdare.errors import UserInputError

__all__ = [
    "LifetimeRevocations",
    "NoRevocations",
    "PeriodicRevocations",
    "REVOCATION_SOURCES",
    "RevocationPlan",
    "RevocationSource",
    "TraceRevocations",
    "build_revocation_source",
]

_KEYS = ("lifetime", "speedup", "every", "first", "seed", "trace", "notice", "hit", "step")
HIT_CHOICES = ("all", "workers", "ps")
PS_TARGET = "ps"  # trace=T@ps: a transient PS server
#: A cloud's own lead time from preemption notice to revocation (GCE: 30 s, AWS: 2 minutes).
NOTICE_LEAD_S = {"gcp": 30.0, "aws": 120.0}


@dataclass(frozen=True)
class RevocationPlan:
    """A parsed ``--revocations`` spec."""

    lifetime: str | None = None
    speedup: float = 1.0
    every_s: float | None = None
    first_s: float | None = None
    seed: int = 0
    trace: tuple[tuple[float, int | str | None], ...] = ()  # (seconds, slot | server type | None: any)
    notice_s: float | None = None  # None: the cloud's lead time / speedup (see notice_lead_s)
    hit: str = "all"
    step_s: float | None = None  # emulated seconds per worker step (None: the step-time model's)

    def notice_lead_s(self, cloud: str = "gcp") -> float:
        """Seconds from a parameter server's notice to its revocation (0: none)."""
        if self.notice_s is not None:
            return self.notice_s
        return NOTICE_LEAD_S.get(cloud, NOTICE_LEAD_S["gcp"]) / self.speedup

    def hits(self, role: str) -> bool:
        """Whether injected revocations hit servers of ``role`` (``worker`` or ``ps``)."""
        return self.hit == "all" or self.hit == ("workers" if role == "worker" else "ps")

    @property
    def enabled(self) -> bool:
        return self.lifetime is not None or self.every_s is not None or bool(self.trace)

    @property
    def source(self) -> str:
        """The name of the revocation source this plan builds."""
        if self.lifetime is not None:
            return "lifetime"
        if self.every_s is not None:
            return "periodic"
        return "trace" if self.trace else "none"

    @classmethod
    def parse(cls, text: str | None, seed: int = 0) -> RevocationPlan:
        """Parse ``lifetime=bathtub,speedup=3600`` / ``every=5`` / ``trace=3@0+6@1`` / ``none``.

        Raises:
            UserInputError: malformed spec (one line naming the valid keys).
        """
        if not text or text.strip().lower() == "none":
            return cls(seed=seed)
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            if not sep or not value.strip():
                raise UserInputError(f"--revocations: expected KEY=VALUE, got {part!r} (e.g. lifetime=bathtub,"
                                     "speedup=3600, every=5 or trace=3@0+6@1)")
            fields[key.strip().lower()] = value.strip()
        unknown = set(fields) - set(_KEYS)
        if unknown:
            raise UserInputError(f"--revocations: unknown key {sorted(unknown)[0]!r}; valid: {', '.join(_KEYS)}")
        def number(key: str, kind: type = float) -> float | None:
            if key not in fields:
                return None
            try:
                return kind(fields[key])
            except ValueError:
                raise UserInputError(f"--revocations: {key}={fields[key]} is not a "
                                     f"{'whole number' if kind is int else 'number'}") from None

        try:
            trace = _parse_trace(fields.get("trace"))
        except ValueError as err:
            raise UserInputError(f"--revocations: {err}") from None
        seed_value, speedup = number("seed", int), number("speedup")
        plan = cls(lifetime=fields.get("lifetime"), speedup=1.0 if speedup is None else speedup,
                   every_s=number("every"),
                   first_s=number("first"), seed=seed if seed_value is None else int(seed_value), trace=trace,
                   notice_s=number("notice"), hit=fields.get("hit", "all").lower(), step_s=number("step"))
        if plan.speedup <= 0 or (plan.every_s is not None and plan.every_s <= 0):
            raise UserInputError("--revocations: speedup and every must be positive")
        if plan.notice_s is not None and not plan.notice_s >= 0:
            raise UserInputError("--revocations: notice must be 0 or more seconds")
        if plan.step_s is not None and not (0 < plan.step_s < float("inf")):
            raise UserInputError("--revocations: step must be a positive number of emulated seconds")
        if plan.hit not in HIT_CHOICES:
            raise UserInputError(f"--revocations: hit must be one of {', '.join(HIT_CHOICES)}, got {plan.hit!r}")
        if sum(x is not None for x in (plan.lifetime, plan.every_s, plan.trace or None)) > 1:
            raise UserInputError("--revocations: give one of lifetime=..., every=... or trace=...")
        return plan


def _parse_trace(text: str | None) -> tuple[tuple[float, int | str | None], ...]:
    if not text:
        return ()
    if "@" not in text:  # a trace file
        from pathlib import Path

        from cmdare.measure.revocation_traces import load_revocation_trace

        if not Path(text).expanduser().is_file():
            raise ValueError(f"trace={text}: no such trace file (a schedule is SECONDS@SLOT+...)")
        return load_revocation_trace(text).schedule()
    out = []
    for item in text.split("+"):
        t, sep, slot = item.partition("@")
        if not sep:
            raise ValueError(f"trace entries are SECONDS@SLOT (or SECONDS@ps), got {item!r}")
        if slot.strip().lower() == PS_TARGET:
            if float(t) < 0:
                raise ValueError(f"trace entry {item!r}: seconds must be >= 0")
            out.append((float(t), PS_TARGET))
            continue
        if float(t) < 0 or int(slot) < 0:
            raise ValueError(f"trace entry {item!r}: seconds and slot must be >= 0")
        out.append((float(t), int(slot)))
    return tuple(sorted(out, key=lambda entry: entry[0]))


class RevocationSource:
    """When transient servers are revoked. Drivers ask :meth:`deadline` when a server is ready and
    :meth:`due` as time passes (the simulator schedules itself at :meth:`next_due`)."""

    name = "none"

    def deadline(self, worker: WorkerInfo) -> float | None:
        """When the server of ``worker`` dies of old age (None: never by lifetime)."""
        return None

    def due(self, now: float, started_at: float, live: Sequence[WorkerInfo]) -> list[int]:
        """Worker ids to revoke at ``now`` besides expired deadlines (periodic and scripted sources)."""
        return []

    def next_due(self, started_at: float) -> float | None:
        """The next time :meth:`due` may return a worker (None: never)."""
        return None

    def snapshot(self) -> dict[str, Any]:
        """What this source has drawn and done so far, as JSON-able values (saved with a checkpoint)."""
        return {}

    def restore(self, saved: dict[str, Any]) -> None:
        """Go on from a :meth:`snapshot`: the draws and picks to come are the ones the saved run would have made."""


def _rng_state(rng: np.random.Generator | None) -> dict[str, Any]:
    return {} if rng is None else {"rng": rng.bit_generator.state}


def _restore_rng(rng: np.random.Generator | None, saved: dict[str, Any]) -> None:
    if rng is not None and saved.get("rng"):
        rng.bit_generator.state = saved["rng"]


REVOCATION_SOURCES: Registry[RevocationSource] = Registry("revocation source")


@REVOCATION_SOURCES.register("none")
class NoRevocations(RevocationSource):
    """No injected revocations."""


@REVOCATION_SOURCES.register("lifetime")
class LifetimeRevocations(RevocationSource):
    """Lifetimes drawn per server (``draw``), divided by ``speedup``, counted from ``ready_at``."""

    name = "lifetime"

    def __init__(self, draw: Callable[[WorkerInfo], float | None], speedup: float = 1.0,
                 rng: np.random.Generator | None = None):
        self.draw, self.speedup = draw, speedup
        self.rng = rng  # the generator ``draw`` draws from (saved and restored with the run's state)

    @classmethod
    def from_model(cls, model_name: str, rng: np.random.Generator, speedup: float = 1.0) -> LifetimeRevocations:
        """Draws from the lifetime model ``model_name`` (see :mod:`cmdare.measure.lifetime_models`)."""
        from cmdare.measure.lifetime_models import load_lifetime_model

        model = load_lifetime_model(model_name)
        return cls(lambda _w: float(model.sample(rng, 1)[0]), speedup, rng)

    def deadline(self, worker: WorkerInfo) -> float | None:
        if not worker.server.transient:
            return None
        life = self.draw(worker)
        return None if life is None else worker.ready_at + life / self.speedup

    def snapshot(self) -> dict[str, Any]:
        return _rng_state(self.rng)

    def restore(self, saved: dict[str, Any]) -> None:
        _restore_rng(self.rng, saved)


@REVOCATION_SOURCES.register("periodic", "every")
class PeriodicRevocations(RevocationSource):
    """One trained transient worker, picked at random, every ``every_s`` (the first after ``first_s``)."""

    name = "periodic"

    def __init__(self, every_s: float, first_s: float | None, rng: np.random.Generator):
        self.every_s, self.first_s, self.rng = every_s, first_s, rng
        self._next: float | None = None

    def next_due(self, started_at: float) -> float | None:
        if self._next is None:
            self._next = started_at + (self.first_s if self.first_s is not None else self.every_s)
        return self._next

    def due(self, now: float, started_at: float, live: Sequence[WorkerInfo]) -> list[int]:
        at = self.next_due(started_at)
        if at is None or now < at:
            return []
        self._next = now + self.every_s
        eligible = [w for w in live if w.trained_at is not None and w.server.transient]
        return [eligible[int(self.rng.integers(len(eligible)))].worker_id] if eligible else []

    def snapshot(self) -> dict[str, Any]:
        return {**_rng_state(self.rng), "next": self._next}

    def restore(self, saved: dict[str, Any]) -> None:
        _restore_rng(self.rng, saved)
        self._next = saved.get("next", self._next)


@REVOCATION_SOURCES.register("trace")
class TraceRevocations(RevocationSource):
    """A scripted schedule or a replayed trace: ``(seconds after the first step, target)`` pairs, the
    seconds divided by ``speedup``. A target is a data slot (int), a server type (str, case-insensitive:
    the lowest live slot of that GPU type), ``"ps"`` (the longest-serving transient PS server, with
    ``--ps-transient``) or None (the lowest live transient slot); a target with no live server at that
    moment is skipped."""

    name = "trace"

    def __init__(self, schedule: Sequence[tuple[float, int | str | None]], speedup: float = 1.0):
        self.schedule = sorted(schedule, key=lambda entry: entry[0])
        self.speedup = speedup
        self._done = 0

    def _at(self, started_at: float, i: int) -> float:
        return started_at + self.schedule[i][0] / self.speedup

    def next_due(self, started_at: float) -> float | None:
        return self._at(started_at, self._done) if self._done < len(self.schedule) else None

    def due(self, now: float, started_at: float, live: Sequence[WorkerInfo]) -> list[int]:
        out: list[int] = []
        while self._done < len(self.schedule) and self._at(started_at, self._done) <= now:
            target = self.schedule[self._done][1]
            self._done += 1
            if isinstance(target, int):
                out += [w.worker_id for w in live if w.slot == target and w.worker_id not in out]
                continue
            role = "ps" if target == PS_TARGET else "worker"
            hit = [w for w in sorted(live, key=lambda w: (w.slot, w.ready_at)) if w.worker_id not in out
                   and w.server.transient and w.server.role == role
                   and (target in (None, PS_TARGET) or str(w.server.gpu_type).lower() == target.lower())]
            out += [hit[0].worker_id] if hit else []
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"done": self._done}

    def restore(self, saved: dict[str, Any]) -> None:
        self._done = int(saved.get("done", self._done))


def build_revocation_source(plan: RevocationPlan, rng: np.random.Generator | None = None) -> RevocationSource:
    """The source a parsed plan describes (raises a one-line error for an unreadable lifetime model)."""
    rng = rng if rng is not None else np.random.default_rng(plan.seed)
    if plan.lifetime == "auto":  # each server's catalog offering picks its market's lifetime model
        from cmdare.measure.lifetime_markets import offering_draw

        return LifetimeRevocations(offering_draw(rng), plan.speedup, rng)
    if plan.lifetime is not None:
        return LifetimeRevocations.from_model(plan.lifetime, rng, plan.speedup)
    if plan.every_s is not None:
        return PeriodicRevocations(plan.every_s, plan.first_s, rng)
    if plan.trace:
        return TraceRevocations(plan.trace, plan.speedup)
    return NoRevocations()
