"""A replacement whose start fails for a reason not its own is asked for again (issue 42 item 9).

On a Ray cluster a worker's node dies; the run asks for its replacement at once, and the GCS, which has not yet
marked the node dead, places it there; when it does, it cancels the creation: the replacement's start fails
though nothing is wrong with it. The controller asks for the same server again (a new worker of the same slot)
until one trains or the replacement time-out, counted from the first request, ends; a failure of the worker's own
code still ends the run. Scheduled by event: a kill at a step, start failures by the driver's answer to the
start (no wall-clock schedule against training speed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from fake_driver import FakeDriver, FakeWorker

from cmdare.cloud.servers import ServerSpec
from cmdare.control import MembershipKernel, PsServerKernel, RevocationPlan, build_revocation_source
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.controller import RunController
from cmdare.control.emulated_clock import EmulatedClock
from cmdare.control.run_config import RunConfig
from cmdare.control.worker_control import MAX_START_RETRIES

K80 = ServerSpec("k80", "gcp", "us-east1", True, 0.14)
PS = ServerSpec(None, "gcp", "us-east1", False, 0.05, role="ps")
NODE_DIED = "its node died while it started (the GCS cancelled its scheduling)"


@dataclass
class NodeDyingDriver(FakeDriver):
    """A replacement's start fails, not by its own fault (its node died under it), while ``dies(start)`` says so:
    the driver answers the start with a non-deterministic ``WorkerStartFailed`` after ``up_wall_s``."""

    dies: Callable[[C.StartWorker], bool] = lambda _start: False

    def _do_StartWorker(self, c: C.StartWorker) -> None:
        if c.replaces is None or not self.dies(c):
            super()._do_StartWorker(c)
            return
        self.workers[c.worker_id] = FakeWorker(c.worker_id, c.slot)
        self.feed(E.ServerStarting(wall=self.wall, worker_id=c.worker_id, startup_s=self.startup_s))
        self.later(self.up_wall_s, E.WorkerStartFailed(wall=self.wall + self.up_wall_s, worker_id=c.worker_id,
                                                      error=NODE_DIED, deterministic=False))


def cluster_run(dies: Callable[[C.StartWorker], bool], steps: int = 2000, timeout_s: float | None = 600.0,
                real: bool = True, **driver_kw) -> NodeDyingDriver:
    """A 2-worker run; on a real cluster (cloud time is the driver's clock, replacements join when up, the
    replacement time-out applies) unless ``real`` is False (local emulation: no time-out). Worker 0's node dies
    at step 100 (its chunk fails: no notice, not injected)."""
    plan = RevocationPlan.parse("none", seed=1)
    source = build_revocation_source(plan, np.random.default_rng(1))
    kernel = MembershipKernel(2, replacement="same", revocations=source)
    config = RunConfig(steps=steps, workers=2, checkpoint_every=100, hit_workers=False, step_s={"*": 1.0},
                       run_id="r", admit_on_up=real, trained_on_join=not real,
                       replacement_timeout_s=timeout_s if real else None)
    controller = RunController(config, kernel, PsServerKernel(None), None if real else EmulatedClock())
    driver = NodeDyingDriver(controller, real_time=real, dies=dies, **driver_kw)
    driver.on_step[100] = lambda d: d.kill(0)
    driver.start([K80, K80], PS, 1, 0)
    return driver


def replacement_starts(d: FakeDriver) -> list[C.StartWorker]:
    return [c for c in d.of(C.StartWorker) if c.replaces is not None]


def test_a_replacement_whose_node_died_under_it_is_asked_for_again_and_trains():
    d = cluster_run(dies=lambda c: c.worker_id == 2)  # the first replacement lands on the dying node
    end = d.run()
    assert end is not None and end.status == "finished" and d.step == 2000, end
    starts = replacement_starts(d)
    assert [(c.worker_id, c.slot, c.replaces, c.spec) for c in starts] == [(2, 0, 0, K80), (3, 0, 0, K80)]
    cancelled = d.of(C.CancelWorker)
    assert [(c.worker_id, c.retried) for c in cancelled] == [(2, True)] and NODE_DIED in cancelled[0].reason
    assert d.controller.workers.rec(3).member and d.controller.workers.rec(3).retries == 1
    kinds = [e.kind for e in d.controller.workers.kernel.timeline]
    assert kinds.count("replacement_retried") == 1 and "replacement_failed" not in kinds
    retried = next(e for e in d.controller.workers.kernel.timeline if e.kind == "replacement_retried")
    assert (retried.worker_id, retried.slot, retried.details["why"]) == (0, 0, NODE_DIED)


def test_retries_go_on_until_the_replacement_time_out_then_the_policy_falls_back():
    # every start of the slot fails 5 s after it is asked for; the time-out is 30 s from the first request
    d = cluster_run(dies=lambda c: True, timeout_s=30.0, up_wall_s=5.0, steps=20000)
    end = d.run(max_wall=5000)
    assert end is not None and end.status == "finished", end  # trained on with the survivor
    starts = replacement_starts(d)
    assert len(starts) == 6  # asked at 0, 5, ..., 25 s; the failure at 30 s is past the time-out
    assert all((c.slot, c.spec) == (0, K80) for c in starts)
    retried = [c.retried for c in d.of(C.CancelWorker)]
    assert retried == [True] * 5 + [False]
    last = d.of(C.CancelWorker)[-1].reason
    assert "failed to start" in last and "asked for 6 times" in last
    kinds = [e.kind for e in d.controller.workers.kernel.timeline]
    assert kinds.count("replacement_retried") == 5 and kinds.count("replacement_failed") == 1


def test_without_a_time_out_a_start_is_asked_for_again_at_most_the_cap_in_a_row():
    # local emulation: no replacement time-out; each start fails before its emulated start-up ends (not joined)
    d = cluster_run(dies=lambda c: True, real=False, steps=600, startup_s=1e6)
    end = d.run()
    assert end is not None and end.status == "finished", end
    assert len(replacement_starts(d)) == 1 + MAX_START_RETRIES
    assert [c.retried for c in d.of(C.CancelWorker)] == [True] * MAX_START_RETRIES + [False]


def test_a_worker_whose_own_code_fails_to_start_still_ends_the_run():
    d = cluster_run(dies=lambda c: False, fail_start={2: "ValueError: bad layer"})
    end = d.run()
    assert end is not None and end.status == "failed"
    assert "worker 2 could not start: ValueError: bad layer" in end.message
    assert len(replacement_starts(d)) == 1 and not d.of(C.CancelWorker)
