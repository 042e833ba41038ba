"""Warm spares (``TrainSpec.warm_spares``): a lost worker's replacement is a standby process that already
imported torch, read the data and built the model; a new standby starts in its place; all of them end
with the run. On a local multi-node Ray cluster, each standby on a Ray node of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmdare.cloud.local import LocalClusterProvider
from cmdare.errors import UserInputError
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _KillNodeOnceSpareIsWarm(TrainCallback):
    """Removes one worker's node (no grace: its processes die, as in a revocation without notice) at the first
    chunk from step ``after`` on, once a standby is ready (the run is held there until one is); records every
    report."""

    def __init__(self, cluster, after: int):
        self.cluster, self.after = cluster, after
        self.trainer = None
        self.steps, self.events = [], []
        self.spare_ready = False
        self.killed: tuple[int, str] | None = None  # (worker id, server id)

    def on_event(self, r):
        self.events.append(r)
        self.spare_ready = self.spare_ready or r.kind == "standby_ready"

    def on_step(self, r):
        self.steps.append(r)
        if self.killed is None and r.global_step >= self.after:
            self._hold_until_a_spare_is_ready()
        if self.killed is None and self.spare_ready and r.global_step >= self.after:
            w = next(w for w in self.trainer.workers.values() if w is not self.trainer.chief)
            self.killed = (w.worker_id, w.server.server_id)
            self.cluster.remove_node(w.server.node, allow_graceful=False)

    def _hold_until_a_spare_is_ready(self, limit_s: float = 300.0):
        """The run waits at step ``after`` for the event, not a race between the standby's start and the
        run's end: the driver is held here while the pool is ticked (as the driver would) until one is ready."""
        import time

        give_up = time.monotonic() + limit_s
        while not self.spare_ready and time.monotonic() < give_up:
            self.trainer.members.pool.tick(time.time())
            time.sleep(0.05)

    def kinds(self, kind):
        return [e for e in self.events if e.kind == kind]


def _spec(**kw) -> TrainSpec:
    base = dict(model="resnet8", dataset="digits", workers=2, ps=1, steps=400, batch_size=32,
                optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, seed=3, transient=True,
                revocations="none", replace="same", startup="0", chunk_steps=5, warm_spares=1)
    base.update(kw)
    return TrainSpec(**base)


def _run_with_a_node_killed(cluster, tmp_path, spec):
    log = _KillNodeOnceSpareIsWarm(cluster, after=20)
    trainer = Trainer(spec, [log], checkpoint_dir=tmp_path, provider=LocalClusterProvider(cluster))
    log.trainer = trainer
    summary = trainer.run()
    assert log.killed is not None, "no standby was ready before the run ended"
    return trainer, summary, log


def _assert_replaced_from_the_pool(trainer, log):
    lost_id, lost_server = log.killed
    standbys = [e.server_id for e in log.kinds("standby_requested")]
    (request,) = [e for e in log.kinds("replacement_requested") if e.worker_id == lost_id]
    # the replacement's server is the standby's, and the standby was warm: nothing was started for it
    assert request.details["warm"] and request.details["spare"] == "up"
    assert request.server_id == standbys[0] and request.details["replaces"] == lost_server
    (joined,) = [e for e in log.kinds("replacement_joined") if e.details["replaces_worker"] == lost_id]
    assert joined.server_id == standbys[0] and joined.details["warm"]
    (trained,) = [e for e in log.kinds("replacement_trained") if e.details["replaces_worker"] == lost_id]
    assert trained.details["first_pull_s"] >= 0 and trained.details["adopt_init_s"] >= 0
    # ... and it trained: chunks of steps reported by the new worker
    assert sum(r.steps for r in log.steps if r.worker_id == joined.worker_id) > 0
    # a new standby was requested in its place, when the replacement took the old one
    (lost,) = [e for e in log.kinds("worker_lost") if e.worker_id == lost_id]
    assert len(standbys) == 2 and log.kinds("standby_requested")[1].time >= lost.time
    # the end: every standby's server ended, every process the pool started is gone, every node removed
    ended = {e.server_id for e in log.kinds("server_ended")}
    assert set(standbys) <= ended
    assert all(not s.alive for s in trainer.provider.servers)
    for actor in trainer.members.pool.actors:
        import ray

        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ping.remote(), timeout=30)
    assert not log.cluster.worker_nodes
    return joined


@pytest.mark.cluster  # make test-cluster: a multi-node cluster with warm spares
def test_a_killed_workers_replacement_is_a_warm_spare(cluster, tmp_path):
    trainer, summary, log = _run_with_a_node_killed(cluster, tmp_path, _spec())
    assert summary.status == "finished" and summary.global_step == 400
    assert summary.revocations == 1 and summary.replacements == 1
    _assert_replaced_from_the_pool(trainer, log)


@pytest.mark.cluster  # make test-cluster: a multi-node cluster with warm spares
def test_a_synchronous_run_trains_on_with_a_warm_replacement(cluster, tmp_path):
    trainer, summary, log = _run_with_a_node_killed(cluster, tmp_path, _spec(sync=True, steps=200, eval_every=0))
    assert summary.status == "finished" and summary.global_step == 200  # the target, not one round past it
    joined = _assert_replaced_from_the_pool(trainer, log)
    # synchronous: every push of the newcomer was part of a round on the parameters it pulled
    newcomer = [r for r in log.steps if r.worker_id == joined.worker_id]
    assert newcomer and all(s == 0 for r in newcomer for s in r.staleness)
    # global steps are rounds: the chunks reported never count more steps than the shards applied
    assert max(r.global_step for r in log.steps) == 200
    assert summary.final_accuracy is not None and summary.final_accuracy > 0.8  # digits: ~0.95 fault-free


@pytest.mark.cluster  # make test-cluster: real shard and worker actors
def test_a_synchronous_standby_pushes_its_first_step_on_the_rounds_parameters(cluster):
    """A standby adopted as a synchronous worker pulls at once; the survivor's lone rounds go on until the round
    grows to count it, so its first step pulls again: its push is part of a round on the parameters it pulled."""
    import ray

    from cmdare.ps.layout import shard_arrays_from_model_flat
    from cmdare.ps.placement import get_placement
    from cmdare.ps.shard import BlockData, SyncShardActor
    from cmdare.train.run.run_start import initial_state
    from cmdare.train.workers.warm_pool import StandbyWorker
    from cmdare.train.workers.worker import Worker

    spec = _spec(sync=True, warm_spares=1)
    infos, params, momentum, *_ = initial_state(spec, "t", None, None, False)
    placement = get_placement(spec.placement).place(infos, 1)
    shard = ray.remote(SyncShardActor).options(num_cpus=0).remote(0, spec.optimizer, None, 1)
    (values,), (moms,) = (shard_arrays_from_model_flat(a, infos, placement) for a in (params, momentum))
    ray.get(shard.load.remote(BlockData(tuple(placement.blocks_on(0)), values, moms, 0)))
    survivor = ray.remote(Worker).options(num_cpus=0).remote(0, 0, 2, spec, [shard], placement, 1, 0, None, 1.0)
    standby = ray.remote(StandbyWorker).options(num_cpus=0).remote(spec, 1)
    try:
        ray.get(standby.adopt.remote(1, 1, 2, spec, [shard], placement, 1, 0, None, 1.0))
        assert ray.get(survivor.run_steps.remote(2, 600.0)).steps == 2  # rounds of one, after the adoption's pull
        ray.get(shard.set_num_workers.remote(2, 1))
        first, other = ray.get([standby.run_steps.remote(1, 600.0), survivor.run_steps.remote(1, 600.0)])
        assert first.steps == other.steps == 1 and first.staleness == other.staleness == (0,)
        assert first.global_step == other.global_step == 3
    finally:
        for actor in (survivor, standby, shard):
            ray.kill(actor)


@pytest.mark.parametrize("value", [-1, True, 1.5, "2"])
def test_bad_warm_spares_are_refused(value):
    with pytest.raises(UserInputError, match="--warm-spares"):
        TrainSpec(warm_spares=value)


def test_warm_spares_need_replacements():
    with pytest.raises(UserInputError, match="--replace none"):
        TrainSpec(warm_spares=1, replace="none")
    assert TrainSpec(warm_spares=2).warm_spares == 2


@pytest.mark.parametrize("args", [["--warm-spares", "-1"], ["--warm-spares", "2", "--replace", "none"]])
def test_cli_refuses_bad_warm_spares_in_one_line(tmp_path, args):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    res = subprocess.run([str(Path(sys.executable).parent / "cmdare"), "train", "--no-record", "--steps", "5", *args],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr + res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "--warm-spares" in lines[0], res.stderr
