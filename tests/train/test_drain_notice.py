"""Ray's preemption drain as a notice: a worker's node of a local multi-node cluster is drained with reason
preemption and a deadline (what autoscaler v2 and KubeRay do when a spot node is preempted); the run treats
it like a cloud notice: the chief checkpoints, the role hands over, the worker leaves, a replacement joins,
all before the deadline, and the replacement trains before it too (cold, or on a warm spare)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cmdare.cloud.drain_watcher import DRAIN_PROVIDER, DrainWatcher
from cmdare.cloud.local import LocalClusterProvider
from cmdare.errors import RunInterruptedError
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback

DEADLINE_S = 30
STEPS = 100_000  # an upper bound: the run is stopped once the replacement trained

# What `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N` does (the hidden
# developer command resolves the address through the machine's interface, which these tests never use).
_DRAIN = """
import sys, time
import ray
from ray.core.generated import autoscaler_pb2
gcs = ray._raylet.GcsClient(address=sys.argv[1])
ok, why = gcs.drain_node(sys.argv[2], autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                         "spot preemption (test)", int(time.time() * 1000) + int(sys.argv[3]) * 1000)
sys.exit(0 if ok else f"drain refused: {why}")
"""


class _DrainChief(TrainCallback):
    """Drains the chief's node once the run is past ``at_step`` and its warm spares are up (from a process of its
    own, like an operator); stops the run once the replacement has trained ``trained_steps`` steps (the run is
    long enough for any start-up: it ends by this event, not by a race with its step count)."""

    def __init__(self, at_step: int, spares: int, trained_steps: int = 20):
        self.at_step, self.trainer, self.events, self.checkpoints = at_step, None, [], []
        self.spares, self.trained_steps, self.replacement_steps = spares, trained_steps, 0
        self.drained: dict | None = None

    def on_step(self, r):
        if self.drained is not None and r.worker_id >= 2:  # the first wave is workers 0 and 1
            self.replacement_steps += r.steps
            if self.replacement_steps >= self.trained_steps:
                self.trainer.request_stop("the replacement trained")
        spares_up = sum(1 for e in self.events if e.kind == "standby_ready") >= self.spares
        if (self.drained is None and r.global_step >= self.at_step and spares_up
                and self.trainer.chief is not None):
            chief = self.trainer.chief
            self.drained = {"worker_id": chief.worker_id, "node_id": chief.server.node.node_id}
            address = self.trainer.provider.cluster.gcs_address
            self.drained["proc"] = subprocess.run([sys.executable, "-c", _DRAIN, address, self.drained["node_id"],
                                                   str(DEADLINE_S)], capture_output=True, text=True, timeout=60)

    def on_event(self, r):
        self.events.append(r)

    def on_checkpoint(self, r):
        self.checkpoints.append(r)


@pytest.mark.cluster  # make test-cluster: a multi-node cluster with a drain
@pytest.mark.parametrize("warm_spares", [0, 1])
def test_a_preemption_drain_is_a_notice_the_chief_checkpoints_leaves_and_is_replaced(cluster, tmp_path, warm_spares):
    spec = TrainSpec(model="resnet8", workers=2, steps=STEPS, checkpoint_every=STEPS, eval_every=0, transient=True,
                     revocations="none", replace="same", startup="0", chunk_steps=5, warm_spares=warm_spares)
    hook = _DrainChief(at_step=60, spares=warm_spares)
    trainer = Trainer(spec, [hook], checkpoint_dir=tmp_path / "ckpt", provider=LocalClusterProvider(cluster))
    hook.trainer = trainer
    with pytest.raises(RunInterruptedError):  # stopped once the replacement trained
        trainer.run()
    summary = trainer._summary_value

    assert hook.drained is not None and hook.drained["proc"].returncode == 0, hook.drained
    assert summary.status == "interrupted" and summary.global_step < STEPS
    kinds = [e.kind for e in hook.events]
    notice = next(e for e in hook.events if e.kind == "notice")
    assert notice.worker_id == hook.drained["worker_id"] and notice.details["provider"] == DRAIN_PROVIDER
    assert notice.details["chief"] is True
    # handled within the deadline: the chief's checkpoint stored, the role handed over, the server released
    deadline = notice.details["deadline"]
    assert abs(deadline - (notice.details["detected_at"] + DEADLINE_S)) < 5
    assert "checkpoint_failed" not in kinds
    ckpt = next(c for c in hook.checkpoints if c.time >= notice.time)
    assert ckpt.worker_id == hook.drained["worker_id"] and ckpt.time < deadline
    change = next(e for e in hook.events if e.kind == "chief_change" and e.time >= notice.time)
    assert change.details["from"] == hook.drained["worker_id"] and change.time < deadline
    ended = next(e for e in hook.events if e.kind == "server_ended" and e.details.get("reason") == "notice")
    assert ended.time < deadline
    assert kinds.index("replacement_requested") > kinds.index("notice")
    joined = next(e for e in hook.events if e.kind == "replacement_joined")
    assert joined.details["replaces_worker"] == hook.drained["worker_id"]
    # ... and the replacement trains before the noticed server's deadline (on a warm spare: its process was up)
    trained = next((e for e in hook.events if e.kind == "replacement_trained"), None)
    assert trained is not None, [e.kind for e in hook.events]
    assert trained.details["replaces_worker"] == hook.drained["worker_id"] and trained.time < deadline
    assert bool(trained.details.get("warm")) == bool(warm_spares)
    assert summary.revocations == 1 and summary.replacements == 1


def test_drain_watcher_reports_only_its_own_node_with_the_deadline():
    drains = {"other": 0}
    watcher = DrainWatcher("mine", source=lambda: dict(drains), clock=lambda: 1000.0)
    assert watcher.poll_once() is None  # another node drains
    drains["mine"] = 1_030_000
    notice = watcher.poll_once()
    assert notice.provider == DRAIN_PROVIDER and notice.deadline == 1030.0 and notice.detected_at == 1000.0
    drains["mine"] = 0  # a drain without a deadline: the GCE window is assumed
    assert watcher.poll_once().deadline == 1030.0
