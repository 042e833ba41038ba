"""What the run controller needs to know about a run (a pure value, built from a ``TrainSpec`` by the trainer
and from a job and cluster by the simulator)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from cmdare.errors import UserInputError

__all__ = ["DRIVERS", "RunConfig", "run_config_for"]

#: Who drives the controller: a real Ray cluster (wall clock, what the cloud does), a local run that emulates its
#: cloud (cloud time from training), the planner's simulator (SimPy time, duties virtual, no real waits).
DRIVERS = ("real", "emulated", "simulated")
#: On a real cluster the last shard parks at least this long before its deadline (the time the move takes).
PARK_MARGIN_S = 5.0


@dataclass(frozen=True)
class RunConfig:
    """A run as the controller sees it.

    Attributes:
        steps: the target global step.
        workers: the planned number of workers (data slots).
        sync: synchronous rounds (one push per worker per step).
        checkpoint_every, eval_every: the chief's duties (0: never; an evaluation always ends the run).
        balance_every: steps between balancing steps (0: no balancer asks).
        virtual_duties: duties are taken and stored the moment their step is passed (the simulator, which
            charges their cost in its speed model); else the chief runs them at fences.
        admit_on_up: a replacement joins when its process is up (a real cluster, where the server's start-up
            is what the cloud does); else when its emulated start-up ends (local emulation, the simulator).
        trained_on_join: a worker may be revoked by injection from the moment it joins; else from its first
            chunk (a real cluster's worker that never trained is not revoked by injection).
        hit_workers, hit_ps: whether injected revocations hit worker servers and PS servers.
        ps_notice_s: cloud seconds from a PS server's notice to its revocation (0: no notice).
        replace_ps: start a replacement PS after an evacuation onto survivors.
        park_margin_s: the last shard parks at least this long before its deadline (time the move takes).
        replacement_timeout_s: cloud seconds a replacement may take to be up (a real cluster's node); None:
            no limit.
        start_timeout_s: wall seconds a worker process may take to start (local emulation).
        probe_after_s: wall seconds without news from training workers before they are probed.
        stuck_after_s: wall seconds without progress, though everything answers, before the run fails (also
            the longest the end waits for the final checkpoint's upload).
        max_failed_uploads: checkpoint uploads that may fail in a row before the run stops rather than train on
            with nothing stored.
        max_rollbacks: on a non-finite loss, roll every shard back to the newest stored checkpoint at most this
            often (0: the run stops at the first); one more divergence then ends the run.
        rollback_lr_scale: each rollback multiplies the learning rate by this (1.0: unchanged), so that the
            steps that diverged are not replayed as they were.
        step_s: emulated cloud seconds per step of one worker, per GPU type (lower case); ``"*"``: any type.
        run_id: named in error messages (how to resume).
        checkpoints: where the run's checkpoints are (named in error messages).
        stop_timeout_s: wall seconds a requested stop (Ctrl-C, SIGTERM) may take to store the checkpoint of the
            step it stops at before the run ends without it.
        resumed_from: the step of the checkpoint a resumed run started from (None: a fresh run); a run that
            stored nothing since can still be resumed from it.
        warm_spares: standby servers whose worker process is started before it is needed
            (:mod:`cmdare.control.spares`; 0: none).
        topology: how the workers train together: ``ps`` (parameter-server shards,
            :class:`~cmdare.control.ps_topology.PsTopology`) or ``allreduce`` (an elastic group,
            :class:`~cmdare.control.allreduce_topology.AllReduceTopology`).
    """

    steps: int
    workers: int
    sync: bool = False
    checkpoint_every: int = 0
    eval_every: int = 0
    balance_every: int = 0
    virtual_duties: bool = False
    admit_on_up: bool = False
    trained_on_join: bool = True
    hit_workers: bool = True
    hit_ps: bool = False
    ps_notice_s: float = 0.0
    replace_ps: bool = True
    park_margin_s: float = 0.0
    replacement_timeout_s: float | None = None
    start_timeout_s: float = 300.0
    probe_after_s: float = 60.0
    stuck_after_s: float = 600.0
    max_failed_uploads: int = 3
    max_rollbacks: int = 0
    rollback_lr_scale: float = 0.5
    step_s: Mapping[str, float] = field(default_factory=lambda: {"*": 1.0})
    run_id: str = "run"
    checkpoints: str = ""
    resumed_from: int | None = None
    stop_timeout_s: float = 120.0
    warm_spares: int = 0
    topology: str = "ps"

    def __post_init__(self) -> None:
        from cmdare.option_values import check_topology

        check_topology(self.topology)
        if self.steps < 1 or self.workers < 1:
            raise UserInputError(f"a run needs steps >= 1 and workers >= 1, got {self.steps} and {self.workers}")
        if self.max_failed_uploads < 1:
            raise UserInputError(f"max_failed_uploads must be at least 1, got {self.max_failed_uploads}")
        if self.warm_spares < 0:
            raise UserInputError(f"warm_spares must not be negative, got {self.warm_spares}")
        if self.max_rollbacks < 0:
            raise UserInputError(f"max_rollbacks must not be negative, got {self.max_rollbacks}")
        if not 0 < self.rollback_lr_scale <= 1:
            raise UserInputError(f"the rollback learning-rate scale must be in (0, 1], got {self.rollback_lr_scale}")
        bad = {k: v for k, v in self.step_s.items() if not (isinstance(v, int | float) and math.isfinite(v) and v > 0)}
        if bad:
            raise UserInputError(f"emulated seconds per step must be positive numbers, got {bad}")

    def seconds_per_step(self, gpu: str | None) -> float:
        """Emulated cloud seconds one step of a worker on ``gpu`` takes."""
        key = (gpu or "").lower()
        return float(self.step_s.get(key, self.step_s.get("*", 1.0)))

    @property
    def final_checkpoint(self) -> bool:
        return self.checkpoint_every > 0

    def resume_hint(self, latest: int | None = None) -> str:
        """Where the run's checkpoint is and what to run to continue it (``latest``: its step, if any)."""
        where = f" in {self.checkpoints}" if self.checkpoints else ""
        latest = latest if latest is not None else self.resumed_from
        if latest is None:
            return f"no checkpoint was stored{where}; there is nothing to resume: start the run again"
        return f"the latest checkpoint is step {latest}{where}; resume with --resume {self.run_id}"


def run_config_for(driver: str, *, steps: int, workers: int, replacement_timeout_s: float | None = None,
                   **options: object) -> RunConfig:
    """The one builder of a :class:`RunConfig`, for the trainer and the simulator alike: the run's own ``options``
    (sync, duties, revocations that hit, notice lead, rollbacks, step times ...), and what ``driver`` (one of
    :data:`DRIVERS`) means for the rest.

    * ``real``: a replacement joins when its process is up, and one that never trained is not revoked by injection;
      the last shard parks :data:`PARK_MARGIN_S` before its deadline; a replacement may take
      ``replacement_timeout_s`` of cloud time to come;
    * ``emulated``: replacements join when their emulated start-up ends; no replacement time-out (the emulated
      start-up is the cloud's);
    * ``simulated``: as emulated, but duties are virtual (taken the moment their step is passed) and nothing waits
      on a real process, so no start, probe or progress deadline; the replacement time-out is the plan's.
    """
    if driver not in DRIVERS:
        raise ValueError(f"driver {driver!r}: one of {DRIVERS}")
    real, simulated = driver == "real", driver == "simulated"
    kinds: dict[str, object] = {"admit_on_up": real, "trained_on_join": not real,
                                "park_margin_s": PARK_MARGIN_S if real else 0.0,
                                "replacement_timeout_s": replacement_timeout_s if real or simulated else None}
    if simulated:
        kinds.update(virtual_duties=True, start_timeout_s=math.inf, probe_after_s=math.inf, stuck_after_s=math.inf)
    return RunConfig(steps=steps, workers=workers, **{**options, **kinds})  # type: ignore[arg-type]
