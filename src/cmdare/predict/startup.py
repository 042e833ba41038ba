"""Startup-phase time distributions of cloud GPU servers (provisioning, staging, booting).

Each phase is log-normal per (GPU type, region, transient) group, fitted on the CM-DARE startup
measurements (and on cmdare's own server records when passed to :meth:`StartupModel.fit`).
A group with too few samples borrows from the pooled fit of the same transient flag (partial
pooling by sample count), so an unseen GPU type or region still gets a sensible distribution.
Framework start (TensorFlow/Ray worker up) is a separate, optional constant phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["PHASES", "StartupModel"]

PHASES = ("Provisioning", "Staging", "Booting")
_PRIOR_N = 5.0  # pseudo-samples of the pooled fit mixed into a group's fit


def _region_key(region: str | None) -> str:
    """``us-east1`` -> ``east`` (the public data names regions by coast); others as given."""
    text = (region or "*").lower()
    return "east" if "east" in text else "west" if "west" in text else text


@dataclass
class StartupModel:
    """Log-normal startup phases per (gpu, region, transient).

    Attributes:
        framework_s: seconds added as phase ``Framework`` after booting (0 = not modelled;
            CM-DARE measured ~55 s cold and ~12 s warm TensorFlow start).
        params_: ``{(gpu, region, transient): {phase: (mu, sigma, n)}}`` after :meth:`fit`;
            ``gpu``/``region`` may be ``"*"`` for pooled groups.
    """

    framework_s: float = 0.0
    params_: dict[tuple[str, str, bool], dict[str, tuple[float, float, int]]] = field(default_factory=dict)

    def fit(self, df: pd.DataFrame) -> StartupModel:
        """Fit from a table with columns gpu, region, transient and the phase columns (seconds)."""
        self.params_ = {}
        for transient in (False, True):
            part = df[df["transient"] == transient]
            if len(part):
                self.params_[("*", "*", transient)] = self._fit_group(part, None)
        for (gpu, region, transient), part in df.groupby(["gpu", "region", "transient"]):
            prior = self.params_.get(("*", "*", bool(transient)))
            self.params_[(str(gpu).upper(), _region_key(str(region)), bool(transient))] = self._fit_group(part, prior)
        for (gpu, transient), part in df.groupby(["gpu", "transient"]):
            prior = self.params_.get(("*", "*", bool(transient)))
            self.params_[(str(gpu).upper(), "*", bool(transient))] = self._fit_group(part, prior)
        return self

    @staticmethod
    def _fit_group(part: pd.DataFrame, prior: dict | None) -> dict[str, tuple[float, float, int]]:
        out = {}
        for phase in PHASES:
            logs = np.log(np.maximum(part[phase].dropna().to_numpy(float), 1e-3))
            n = len(logs)
            mu, var = (float(logs.mean()), float(logs.var())) if n else (0.0, 0.0)
            if prior is not None:
                p_mu, p_sigma, _ = prior[phase]
                w = n / (n + _PRIOR_N)
                mu = w * mu + (1 - w) * p_mu
                var = w * var + (1 - w) * p_sigma**2
            out[phase] = (mu, float(np.sqrt(max(var, 1e-6))), n)
        return out

    def _group(self, gpu: str, transient: bool, region: str | None) -> dict[str, tuple[float, float, int]]:
        if not self.params_:
            raise RuntimeError("StartupModel is not fitted; call fit() or use cmdare.predict.startup_model()")
        gpu, reg = gpu.upper(), _region_key(region)
        for key in ((gpu, reg, transient), (gpu, "*", transient), ("*", "*", transient)):
            if key in self.params_:
                return self.params_[key]
        return self.params_[next(iter(self.params_))]

    def phase_params(self, gpu: str, transient: bool, region: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The log-normal ``(mu, sigma)`` of each phase, in :meth:`sample`'s order (``Framework`` not included):
        ``rng.lognormal(mu, sigma)`` draws what :meth:`sample` does."""
        group = self._group(gpu, transient, region)
        return (np.array([v[0] for v in group.values()], dtype=float),
                np.array([v[1] for v in group.values()], dtype=float))

    def sample(
        self, rng: np.random.Generator, gpu: str, transient: bool, region: str | None = None
    ) -> dict[str, float]:
        """One draw of seconds per phase (plus ``Framework`` when ``framework_s`` > 0)."""
        out = {
            ph: float(rng.lognormal(mu, sigma)) for ph, (mu, sigma, _) in self._group(gpu, transient, region).items()
        }
        if self.framework_s > 0:
            out["Framework"] = self.framework_s
        return out

    def mean_s(self, gpu: str, transient: bool, region: str | None = None) -> dict[str, float]:
        """Expected seconds per phase."""
        out = {
            ph: float(np.exp(mu + sigma**2 / 2)) for ph, (mu, sigma, _) in self._group(gpu, transient, region).items()
        }
        if self.framework_s > 0:
            out["Framework"] = self.framework_s
        return out

    def to_json(self) -> dict:
        """Plain-JSON parameters."""
        return {
            "framework_s": self.framework_s,
            "groups": [
                {"gpu": g, "region": r, "transient": t, "phases": {ph: list(v) for ph, v in p.items()}}
                for (g, r, t), p in self.params_.items()
            ],
        }

    @classmethod
    def from_json(cls, obj: dict) -> StartupModel:
        """Inverse of :meth:`to_json`."""
        model = cls(framework_s=float(obj["framework_s"]))
        model.params_ = {
            (g["gpu"], g["region"], bool(g["transient"])): {
                ph: (float(v[0]), float(v[1]), int(v[2])) for ph, v in g["phases"].items()
            }
            for g in obj["groups"]
        }
        return model
