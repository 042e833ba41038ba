"""Training runs whose checkpoints go to an object store, resumed from another machine's data directory."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmdare.errors import StorageError
from cmdare.events import TrainCallback
from cmdare.storage import Storage
from cmdare.train import Trainer, TrainSpec
from cmdare.train.duties.checkpoint import CheckpointStore
from cmdare.train.runtime.run_files import read_run_spec, read_status

CMDARE = [str(Path(sys.executable).with_name("cmdare"))]


class _Log(TrainCallback):
    def __init__(self):
        self.checkpoints, self.events, self.ends = [], [], []

    def on_run_end(self, r):
        self.ends.append(r)

    def on_checkpoint(self, r):
        self.checkpoints.append(r)

    def on_event(self, r):
        self.events.append(r)


def _spec(steps: int, storage: str) -> TrainSpec:
    return TrainSpec(model="resnet8", workers=2, steps=steps, checkpoint_every=10, eval_every=0, batch_size=16,
                     storage=storage, seed=3)


@pytest.mark.cluster  # make test-cluster: two runs against the S3 emulator
def test_a_run_checkpoints_into_s3_and_resumes_elsewhere(local_ray, s3, tmp_path):
    root = f"{s3.url}/runs"
    log = _Log()
    summary = Trainer(_spec(20, root), [log], run_id="run-s3").run()
    assert summary.status == "finished" and summary.details["checkpoint_dir"] == f"{root}/run-s3"
    steps = [c.global_step for c in log.checkpoints]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == 20  # periodic ones, then the final one
    for c in log.checkpoints:  # reported once stored: their data is in the bucket
        assert c.path.startswith(f"{root}/run-s3/ckpt-") and 0 < c.stall_s <= c.duration_s
    run = Storage(f"{root}/run-s3")
    assert CheckpointStore(run).load().step == 20
    assert read_status(run)["status"] == "finished" and read_run_spec(run)["model"] == "resnet8"

    # Another machine: an empty data directory, only the storage URL in common; no --model given.
    env = dict(os.environ, CMDARE_HOME=str(tmp_path / "other-machine"), **s3.env)
    res = subprocess.run(CMDARE + ["train", "--resume", "run-s3", "--storage", root, "--steps", "30", "--no-record",
                                   "--tensorboard", "none"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed run-s3 from step 20" in res.stdout
    assert "finished: step 30" in res.stdout and f"checkpoints: {root}/run-s3" in res.stdout
    assert read_run_spec(run)["model"] == "resnet8" and read_run_spec(run)["steps"] == 30
    assert not (tmp_path / "other-machine" / "checkpoints" / "run-s3").exists()


@pytest.mark.cluster  # make test-cluster: two runs against the GCS emulator
def test_a_run_checkpoints_into_gcs_and_resumes(local_ray, gcs):
    root = f"{gcs.url}/runs"
    assert Trainer(_spec(10, root), run_id="run-gs").run().status == "finished"
    log = _Log()
    summary = Trainer(_spec(20, root), [log], run_id="run-gs", resume=True).run()
    assert summary.status == "finished" and summary.global_step == 20
    assert any(e.kind == "resume" and e.details["step"] == 10 for e in log.events)
    assert CheckpointStore(Storage(f"{root}/run-gs")).load().step == 20


class _CheckpointManifestsFail(Storage):
    """A real directory whose checkpoint manifests of the given steps (all: None) cannot be written."""

    def __init__(self, path, steps=None):
        super().__init__(path)
        self.steps = steps

    def child(self, name: str) -> Storage:
        return _CheckpointManifestsFail(self.path / name, self.steps)

    def put(self, name: str, data: bytes) -> None:
        manifest = name.startswith("ckpt-") and name.endswith(".json")
        if manifest and (self.steps is None or int(name[5:14]) in self.steps):
            raise StorageError(f"cannot write {self.url(name)}: connection reset")
        super().put(name, data)


def test_a_failed_upload_is_reported_and_training_goes_on(local_ray, tmp_path):
    log = _Log()
    summary = Trainer(_spec(20, str(tmp_path)), [log], checkpoint_dir=_CheckpointManifestsFail(tmp_path / "flaky", {10})
                      ).run()
    assert summary.status == "finished" and summary.global_step == 20 and summary.details["failed_checkpoints"] == 1
    failed = [e for e in log.events if e.kind == "checkpoint_failed"]
    assert [e.details["step"] for e in failed] == [10] and "connection reset" in failed[0].details["error"]
    assert [c.global_step for c in log.checkpoints] == [20]


def test_a_run_whose_final_checkpoint_cannot_be_stored_fails(local_ray, tmp_path):
    """Issue 29: storage failing at the end ended 'finished' with one warning, over lost work."""
    from cmdare.errors import TransientError

    log = _Log()
    trainer = Trainer(_spec(20, str(tmp_path)), [log], checkpoint_dir=_CheckpointManifestsFail(tmp_path / "flaky"))
    with pytest.raises(TransientError, match=r"the final checkpoint \(step 20\) could not be stored \(cannot write "
                                             r".*connection reset\); no checkpoint was stored in .*flaky; there is "
                                             r"nothing to resume: start the run again"):
        trainer.run()
    assert [e.details["step"] for e in log.events if e.kind == "checkpoint_failed"] == [10, 20]
    assert [e.status for e in log.ends] == ["failed"] and not log.checkpoints


@pytest.mark.parametrize("storage, message", [
    ("s3://no-such-bucket/runs", "bucket or path does not exist"),
    ("nosuchproto://x", "nosuchproto"),
])
def test_bad_storage_fails_before_training_in_one_line(s3, tmp_path, storage, message):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), **s3.env)
    res = subprocess.run(CMDARE + ["train", "--storage", storage, "--steps", "5", "--no-record"],
                         capture_output=True, text=True, env=env, timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.stderr


@pytest.mark.cluster  # make test-cluster: a real run
def test_status_json_carries_the_real_step_while_the_run_trains(local_ray, tmp_path, monkeypatch):
    """Issue 29: status.json showed global_step 0 throughout a run."""
    from cmdare.train.runtime import run_files

    monkeypatch.setattr(run_files, "HEARTBEAT_S", 0.2)
    run = Storage(tmp_path / "run-hb")
    seen: list[tuple[str, int]] = []

    class _Watch(TrainCallback):
        def on_step(self, r):
            if r.global_step >= 20 and len(seen) < 50:
                status = read_status(run)
                seen.append((status["status"], status["global_step"]))

    summary = Trainer(_spec(60, str(tmp_path)), [_Watch()], checkpoint_dir=run).run()
    assert summary.status == "finished"
    assert any(state == "running" and step > 0 for state, step in seen), seen
    assert read_status(run)["status"] == "finished" and read_status(run)["global_step"] == 60


class _TurnsReadOnly(Storage):
    """A real directory that refuses every write once ``read_only`` is set (a disk remounted read-only)."""

    read_only = False

    def child(self, name: str) -> Storage:
        return type(self)(self.path / name)

    def put(self, name: str, data: bytes) -> None:
        if type(self).read_only:
            raise OSError(30, "Read-only file system", str(self.path / name))
        super().put(name, data)


def test_a_storage_that_turns_read_only_is_said_not_left_saying_running(local_ray, tmp_path):
    """Issue 42: --checkpoint-every 0 with the storage turned read-only mid-run: 'finished', and status.json left
    'running' without a word."""
    import json

    class _ReadOnlyAt(_Log):
        def on_step(self, r):
            if r.global_step >= 10:
                _TurnsReadOnly.read_only = True

    log = _ReadOnlyAt()
    storage = _TurnsReadOnly(tmp_path / "run")
    try:
        spec = dataclasses.replace(_spec(40, str(tmp_path)), checkpoint_every=0)
        summary = Trainer(spec, [log], checkpoint_dir=storage).run()
    finally:
        _TurnsReadOnly.read_only = False
    assert summary.status == "finished"  # no checkpoint was asked for: the training itself is done
    warnings = [e.details["warning"] for e in log.events if e.kind == "storage_warning"]
    assert any(w.startswith("the run's final status (finished) could not be written to ") and "Read-only file system"
               in w for w in warnings), warnings
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "running"  # what it says
