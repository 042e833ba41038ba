"""The planner's models of a local, emulated run: what ``cmdare train --simulate`` simulates for a run that
does not join a cluster.

A local run emulates its cloud (docs/controller.md): cloud time advances with training, at the emulated
cluster's rate (each worker's step time from the step-time model, the members' speeds added up, or the
slowest member's in synchronous rounds); lifetimes, start-up phases and notice leads are the cloud's divided
by ``speedup``; the chief's checkpoints and evaluations take no cloud time (only steps move it); servers are
billed in that time. These wrappers give the simulator the same clocks, so it predicts the emulated run's
revocations, time and cost, not a real cloud's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cmdare.cloud.servers import ServerSpec
from cmdare.plan.spec import PS_SERVER, PlanModels

__all__ = ["CompressedLifetimes", "CompressedStartup", "EmulatedSpeed", "InstantEvacuation", "TrainerStartups",
           "emulated_models"]


class EmulatedSpeed:
    """The emulated cluster's speed: steps per cloud second from each GPU type's seconds per step."""

    def __init__(self, step_s: Mapping[str, float], sync: bool):
        self.step_s, self.sync = step_s, sync

    def worker_steps_per_s(self, gpu: str) -> float:
        return 1.0 / float(self.step_s[gpu])

    def cluster_steps_per_s(self, gpus: Mapping[str, int], ps: int) -> float:
        speeds = {g: self.worker_steps_per_s(g) for g, n in gpus.items() if n > 0}
        if not speeds:
            return 0.0
        return min(speeds.values()) if self.sync else sum(v * gpus[g] for g, v in speeds.items())

    def allreduce_steps_per_s(self, gpus: Mapping[str, int]) -> float:
        """Group steps per cloud second of an emulated all-reduce run: the slowest member's (a local run emulates
        no network link: its members' steps are the GPU types' emulated step times)."""
        return min((self.worker_steps_per_s(g) for g, n in gpus.items() if n > 0), default=0.0)


class CompressedLifetimes:
    """Lifetimes (and capacity waits) of ``inner`` divided by ``speedup``."""

    def __init__(self, inner: Any, speedup: float):
        self.inner, self.speedup = inner, float(speedup)

    def sample(self, rng: np.random.Generator, server: str, region: str, size: int) -> np.ndarray:
        return np.asarray(self.inner.sample(rng, server, region, size), dtype=float) / self.speedup

    def describe(self, server: str, region: str) -> str:
        describe = getattr(self.inner, "describe", None)
        label = str(describe(server, region)) if describe is not None else type(self.inner).__name__
        return f"{label} / {self.speedup:g}" if self.speedup != 1.0 else label

    def capacity_wait(self, rng: np.random.Generator, server: str, region: str) -> float:
        wait = getattr(self.inner, "capacity_wait", None)
        return float(wait(rng, server, region)) / self.speedup if wait is not None else 0.0


class CompressedStartup:
    """Start-up delays of ``inner`` (or a fixed ``seconds``, as ``--startup S``) divided by ``speedup``."""

    def __init__(self, inner: Any, speedup: float, seconds: float | None = None):
        self.inner, self.speedup, self.seconds = inner, float(speedup), seconds

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        if self.seconds is not None:
            return self.seconds / self.speedup
        return float(self.inner.sample(rng, server, transient, region)) / self.speedup


class TrainerStartups:
    """A local run's start-ups as its trainer draws them (:class:`~cmdare.cloud.local.StartupDelay`): the
    start-up model's phases but the framework's (a local worker's real process start, which takes no emulated
    time), divided by ``speedup``, from the trainer's random stream (seeded by ``--seed``), whose first draws are
    the first wave's servers (``first_wave``: ``(GPU type or None for a PS server, transient)`` in the order the
    trainer starts them: the shards, then the workers by data slot). The simulated run after draws the start-ups
    the emulated run with that seed draws, server by server; each further simulated run draws a stream of its
    own (seeded from its generator)."""

    def __init__(self, speedup: float, seed: int, first_wave: Sequence[tuple[str | None, bool]]):
        self.speedup, self.seed, self.first_wave = float(speedup), seed, tuple(first_wave)
        self._run: np.random.Generator | None = None  # the simulated run drawing now
        self._delay: Any = None
        self._runs = 0

    def sample(self, rng: np.random.Generator, server: str, transient: bool, region: str) -> float:
        if rng is not self._run:  # a simulated run's first start-up: its own stream, the first wave drawn first
            from cmdare.cloud.local import StartupDelay
            from cmdare.predict import startup_model

            self._run, self._runs = rng, self._runs + 1
            seed = self.seed if self._runs == 1 else int(rng.integers(2**31))
            self._delay = StartupDelay("model", self.speedup, seed, model=startup_model)
            for gpu, first_transient in self.first_wave:
                self._draw(gpu, first_transient)
        return self._draw(None if server == PS_SERVER else server, transient)

    def _draw(self, gpu: str | None, transient: bool) -> float:
        spec = ServerSpec(gpu, "gcp", "us-central1", transient, 0.0, "worker" if gpu else "ps")
        return float(self._delay.wall_s(self._delay.sample(spec)))


class InstantEvacuation:
    """A PS shard's evacuation as a local run's emulated time sees it: the move is real, but it takes no cloud time
    (only steps move the clock)."""

    source = "free of cloud time (emulated)"

    def pause_s(self, moved_bytes: float) -> float:
        return 0.0


def emulated_models(models: PlanModels, step_s: Mapping[str, float], *, sync: bool, speedup: float,
                    startup_s: float | None = None) -> PlanModels:
    """``models`` as a local run emulates them: the emulated cluster's speed, the cloud's clocks ``speedup``
    times faster (``startup_s``: a fixed start-up, as ``--startup S``), duties and PS evacuations free of cloud
    time, no model error; cloud events take effect at whole steps while workers train (the trainer's controller
    acts at step boundaries: a revocation due mid-step falls at the step's end, a replacement ready mid-step
    joins at the next, a PS notice shorter than a step leaves no boundary to evacuate at)."""
    source = (f"{models.source}; emulated local run: step time per GPU type from the step-time model, the cloud's "
              f"clocks / {speedup:g}, checkpoints free of cloud time")
    evacuation = InstantEvacuation() if models.evacuation is not None else None
    return dataclasses.replace(models, speed=EmulatedSpeed(step_s, sync), evacuation=evacuation,
                               lifetimes=CompressedLifetimes(models.lifetimes, speedup),
                               startup=CompressedStartup(models.startup, speedup, startup_s),
                               checkpoint_s=0.0, notice_s=models.notice_s / speedup, source=source,
                               event_steps=1)
