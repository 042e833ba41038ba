"""Run metrics as a callback: speed (window and mean), revocations, replacements, time lost.

Time lost counts worker-seconds of cloud time (emulated in a local run, the wall clock on a cluster): a
replaced worker's slot from its loss to its replacement joining; a slot whose replacement never came, to
the end of the run; a loss not replaced by policy (``--replace none``), its detection delay.

The coordinator reports steps and events; this callback turns them into the figures of the run's
summary and the speed before a loss that loss events carry.

A resumed run is the same run in another part (:mod:`cmdare.measure.run_parts`): this callback reads the parts
before this one from the run's storage when the part starts, writes them with this one (``running``) at once, so
a part whose driver is killed leaves a trace, and writes this part's figures at its end. The summary's figures
are this part's; ``details["parts"]`` lists every part and ``details["totals"]`` holds the run's in all (sums).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

from cmdare.cloud.local import Server
from cmdare.cloud.servers import cost_usd
from cmdare.events import EventReport, RunInfo, RunSummary, StepReport, TrainCallback, is_revocation
from cmdare.measure.run_parts import ENDLESS, UNKNOWN, RunPart, parts_from, run_totals

__all__ = ["RunMetrics", "SPEED_WINDOW_S"]

SPEED_WINDOW_S = 5.0


class RunMetrics(TrainCallback):
    """Speed over the last :data:`SPEED_WINDOW_S` seconds and since the first step; losses and time lost."""

    def __init__(self) -> None:
        self._speed: collections.deque = collections.deque()  # (time, global_step)
        self.first_step_at: float | None = None
        self.first_step = 0
        self.last_step_at: float | None = None
        self.last_step = 0
        self.revocations = 0
        self.replacements = 0
        self.lost_worker_s = 0.0  # worker-seconds lost: recovery of each replacement, detection of the rest
        self._open_losses: dict[int, float] = {}  # lost worker -> cloud time of the loss, until it is replaced
        self.shards_evacuated = 0
        self.shards_parked = 0  # of which the last shard's, parked until its replacement was up
        self.steps_lost = 0  # rolled back to a checkpoint when a shard died
        self.rollbacks = 0  # rolled back to a checkpoint after a non-finite loss (--on-diverge rollback)
        self.steps_rolled_back = 0
        self.parts: list[RunPart] = []  # the run's parts, this one last (set when the run starts)
        self._storage: str | None = None

    def on_run_start(self, info: RunInfo) -> None:
        """This part of the run: after the parts its storage lists (a resume), or the first; written at once."""
        from cmdare.train.runtime.run_files import read_parts, read_status, write_parts

        self._storage = info.config.get("checkpoint_dir")
        earlier: list[RunPart] = []
        if self._storage and info.resumed_from_step > 0:
            earlier = parts_from(read_parts(self._storage))
            if not earlier:  # a run from before parts were kept: what it trained is all that is known
                earlier = [RunPart(1, None, UNKNOWN, 0, info.resumed_from_step, emulated=info.emulated)]
            for part in earlier:
                if part.status == "running":  # its driver never reported an end: killed, or its machine lost
                    _close_endless(part, read_status, self._storage)
        self.parts = [*earlier, RunPart(len(earlier) + 1, info.started_at, "running", info.resumed_from_step,
                                        emulated=info.emulated)]
        if self._storage:
            write_parts(self._storage, [p.to_dict() for p in self.parts])

    def on_run_end(self, summary: RunSummary) -> None:
        """This part's figures into the run's storage (the next resume adds its part after them)."""
        from cmdare.train.runtime.run_files import write_parts

        if self._storage and summary.details.get("parts"):
            write_parts(self._storage, summary.details["parts"])

    def start_chunk(self, started_at: float, global_step: int) -> None:
        """The first chunk of the run started at ``started_at`` at ``global_step`` (start-up excluded)."""
        if self.first_step_at is None:
            self.first_step_at, self.first_step = started_at, global_step

    def on_step(self, report: StepReport) -> None:
        self.last_step_at, self.last_step = report.time, report.global_step
        self._speed.append((report.time, report.global_step))
        while len(self._speed) > 2 and report.time - self._speed[0][0] > SPEED_WINDOW_S:
            self._speed.popleft()

    def on_event(self, report: EventReport) -> None:
        details = report.details or {}
        if is_revocation(report.kind, details):
            self.revocations += 1
        elif report.kind == "ps_replacement_joined":
            self.replacements += 1
        elif report.kind == "shard_evacuated":
            self.shards_evacuated += 1
            self.shards_parked += bool(details.get("parked"))
        elif report.kind == "replacement_joined":
            self.replacements += 1
            self.lost_worker_s += float(details.get("recovery_s", 0.0))
            self._open_losses.pop(details.get("replaces_worker"), None)  # type: ignore[arg-type]
        elif report.kind == "worker_lost" and not details.get("replaced", True):
            self.lost_worker_s += float(details.get("detection_delay_s", 0.0))
        elif report.kind == "worker_lost" and report.worker_id is not None:
            self._open_losses[report.worker_id] = float(details.get("cloud_time", report.time))
        elif report.kind == "shard_restored" and details.get("reason") == "diverged":
            self.rollbacks += 1
            self.steps_rolled_back += int(details.get("steps_lost", 0))
            self._speed.clear()
        elif report.kind == "shard_restored":
            self.steps_lost += int(details.get("steps_lost", 0))
            self._speed.clear()  # the step went back to the checkpoint's

    def window_speed(self, including: tuple[float, int] | None = None) -> float:
        """Global steps/s over the recent window (0 before two chunks); ``including`` a (time, step) point
        not reported yet (the speed a step report about to be sent carries)."""
        points = list(self._speed) if including is None else [*self._speed, including]
        while including is not None and len(points) > 2 and including[0] - points[0][0] > SPEED_WINDOW_S:
            points.pop(0)
        if len(points) < 2:
            return 0.0
        (t0, s0), (t1, s1) = points[0], points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def mean_speed(self) -> float:
        """Global steps/s from the first reported chunk to the last (start-up excluded)."""
        if self.first_step_at is None or self.last_step_at is None:
            return 0.0
        span = self.last_step_at - self.first_step_at
        return (self.last_step - self.first_step) / span if span > 0 else 0.0

    def summary(self, run_id: str, status: str, t_start: float, global_step: int, servers: Sequence[Server],
                accuracy: float | None, loss: float | None, *, planned_workers: int, emulated: bool,
                checkpoint_dir: str, failed_checkpoints: int = 0, cloud_now: float | None = None,
                emulated_time: bool = False) -> RunSummary:
        """The run's :class:`RunSummary`: speed, losses, time lost per planned worker (``cloud_now``: the run's
        cloud time at its end, default the wall clock), and the servers' cost: per-second billing of every server
        that joined or ended; in emulated cloud time where the run emulates it (``emulated_time``), billed
        continuously, as the simulation of its command line bills (an emulated second stands for ``speedup`` of
        the cloud's, so whole emulated seconds would round each server up by as much)."""
        now = time.time()
        end = now if cloud_now is None else cloud_now
        # a replacement asked for and never joined: its slot was empty from the loss to the end
        lost_worker_s = self.lost_worker_s + sum(max(0.0, end - t) for t in self._open_losses.values())
        billed = [s for s in servers if s.joined_at is not None or not s.alive]
        cost = sum(cost_usd(s.spec, s.billed_s(cloud_now, now), whole_seconds=not emulated_time) for s in billed)
        time_lost_s = lost_worker_s / max(1, planned_workers)
        if not self.parts:  # a run whose start this callback did not hear: one part
            self.parts = [RunPart(1, t_start, emulated=emulated)]
        part = self.parts[-1]
        part.status, part.to_step, part.ended_at, part.wall_s = status, global_step, now, now - t_start
        part.steps_per_s, part.cost_usd, part.time_lost_s = self.mean_speed(), cost, time_lost_s
        part.revocations, part.replacements = self.revocations, self.replacements
        parts = [p.to_dict() for p in self.parts]
        return RunSummary(run_id, now, status, global_step, now - t_start, self.mean_speed(), accuracy, loss,
                          self.revocations, self.replacements, cost,
                          details={"checkpoint_dir": checkpoint_dir, "startup_s": (self.first_step_at or now) - t_start,
                                   "time_lost_s": time_lost_s, "emulated": emulated,
                                   "servers": len(servers), "failed_checkpoints": failed_checkpoints,
                                   "shards_evacuated": self.shards_evacuated, "shards_parked": self.shards_parked,
                                   "steps_lost": self.steps_lost, "rollbacks": self.rollbacks,
                                   "steps_rolled_back": self.steps_rolled_back, "part": part.part, "parts": parts,
                                   "totals": run_totals(self.parts)})


def _close_endless(part: RunPart, read_status, storage: str) -> None:
    """A part that never reported its end: stopped without one, at the step of its last heartbeat (if that
    heartbeat is its own)."""
    from cmdare.errors import DataNotFoundError, StorageError

    part.status = ENDLESS
    try:
        beat = read_status(storage)
    except (DataNotFoundError, StorageError, OSError):
        return
    at = float(beat.get("time", 0.0))
    if at >= (part.started_at or 0.0) and isinstance(beat.get("global_step"), int):
        part.to_step, part.ended_at = beat["global_step"], at
        part.wall_s = at - part.started_at if part.started_at is not None else None
