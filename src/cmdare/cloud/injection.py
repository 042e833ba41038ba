"""Revocation injection for local runs: when each transient server dies.

``--revocations`` takes a spec string:

* ``lifetime=NAME[,speedup=S][,seed=N]``: each transient server lives a lifetime drawn from the
  lifetime model ``NAME`` (``bathtub``, ``exponential``, ``empirical``, ``bathtub:k80``, a saved
  model file; see :mod:`cmdare.measure.lifetime_models`), divided by ``speedup`` (time compression:
  ``speedup=3600`` turns an hour into a second);
* ``every=S[,first=F]``: a transient server is revoked every ``S`` wall seconds (chaos tests);
* ``none``: no injected revocations (notices and real failures are still handled).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cmdare.errors import UserInputError


@dataclass(frozen=True)
class RevocationPlan:
    """A parsed ``--revocations`` spec."""

    lifetime: str | None = None
    speedup: float = 1.0
    every_s: float | None = None
    first_s: float | None = None
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return self.lifetime is not None or self.every_s is not None

    @classmethod
    def parse(cls, text: str | None, seed: int = 0) -> RevocationPlan:
        """Parse ``lifetime=bathtub,speedup=3600`` / ``every=5`` / ``none``."""
        if not text or text.strip().lower() == "none":
            return cls(seed=seed)
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            if not sep or not value.strip():
                raise UserInputError(f"--revocations: expected KEY=VALUE, got {part!r} (e.g. lifetime=bathtub,"
                                     "speedup=3600 or every=5)")
            fields[key.strip().lower()] = value.strip()
        unknown = set(fields) - {"lifetime", "speedup", "every", "first", "seed"}
        if unknown:
            raise UserInputError(f"--revocations: unknown key {sorted(unknown)[0]!r}; valid: lifetime, speedup, "
                                 "every, first, seed")
        try:
            plan = cls(lifetime=fields.get("lifetime"), speedup=float(fields.get("speedup", 1.0)),
                       every_s=float(fields["every"]) if "every" in fields else None,
                       first_s=float(fields["first"]) if "first" in fields else None,
                       seed=int(fields.get("seed", seed)))
        except ValueError as err:
            raise UserInputError(f"--revocations: {err}") from None
        if plan.speedup <= 0 or (plan.every_s is not None and plan.every_s <= 0):
            raise UserInputError("--revocations: speedup and every must be positive")
        if plan.lifetime and plan.every_s:
            raise UserInputError("--revocations: give either lifetime=... or every=..., not both")
        return plan


class RevocationClock:
    """Decides when each transient server is revoked (wall-clock seconds since epoch)."""

    def __init__(self, plan: RevocationPlan):
        self.plan = plan
        self.rng = np.random.default_rng(plan.seed)
        self._model = None
        self._next_periodic: float | None = None
        if plan.lifetime:
            from cmdare.measure.lifetime_models import load_lifetime_model

            self._model = load_lifetime_model(plan.lifetime)

    def deadline(self, joined_at: float) -> float | None:
        """When a server that joined at ``joined_at`` is revoked (None: never, by lifetime)."""
        if self._model is None:
            return None
        life_s = float(self._model.sample(self.rng, 1)[0])
        return joined_at + life_s / self.plan.speedup

    def periodic_due(self, now: float, start: float) -> bool:
        """For ``every=S``: True once per period (the caller revokes one transient server)."""
        if self.plan.every_s is None:
            return False
        if self._next_periodic is None:
            self._next_periodic = start + (self.plan.first_s if self.plan.first_s is not None else self.plan.every_s)
        if now >= self._next_periodic:
            self._next_periodic = now + self.plan.every_s
            return True
        return False
