"""Resuming when the newest checkpoint is gone or corrupt: reported, and an older one only by choice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cmdare.errors import CheckpointError
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore
from cmdare.train.run.run_start import initial_state
from cmdare.train.spec import TrainSpec

SPEC = TrainSpec(model="resnet8", steps=100)


@pytest.fixture()
def run(tmp_path):
    """A run's storage with checkpoints of steps 10 and 20 that fit SPEC's model."""
    storage = Storage(tmp_path / "run-1")
    infos, params, momentum, *_ = initial_state(SPEC, "run-1", storage, None, resuming=False)
    store = CheckpointStore(storage)
    for step in (10, 20):
        store.save(Checkpoint(step, params + step, momentum))
    return storage, params


def test_a_corrupt_newest_checkpoint_names_the_previous_one_and_from_step_takes_it(run):
    storage, params = run
    name = json.loads(storage.get("ckpt-000000020.json"))["file"]
    data = bytearray(storage.get(name))
    data[-30] ^= 0xFF
    storage.put(name, bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch; the previous checkpoint is step 10: resume "
                                              "from it with --from-step 10"):
        initial_state(SPEC, "run-1", storage, None, resuming=True)
    _, resumed, _, _, step, *_ = initial_state(SPEC, "run-1", storage, None, resuming=True, resume_step=10)
    assert step == 10 and np.array_equal(resumed, params + 10)


def test_a_missing_newest_manifest_is_not_resumed_past_silently(run):
    storage, params = run
    storage.delete("ckpt-000000020.json")
    with pytest.raises(CheckpointError, match="step 20 without a manifest"):
        initial_state(SPEC, "run-1", storage, None, resuming=True)
    assert initial_state(SPEC, "run-1", storage, None, resuming=True, resume_step=10)[4] == 10


def test_a_fresh_run_under_an_id_that_has_checkpoints_is_refused_and_changes_nothing(run):
    """The README's snippet ran twice under run_id='waves': the second run's checkpoints rotated the first's out."""
    from cmdare.errors import UserInputError
    from cmdare.train import Trainer

    storage, _ = run
    before = sorted(storage.names("", ""))
    with pytest.raises(UserInputError, match=r"run run-1 already has checkpoints in .*run-1 \(the newest of step 20\): "
                                             r"resume it \(--resume run-1, or resume=True\) or give another run id; "
                                             "nothing was changed"):
        Trainer(SPEC, run_id="run-1", checkpoint_dir=storage).run()
    assert sorted(storage.names("", "")) == before


def test_a_resume_reads_the_controllers_state_stored_with_its_checkpoint(tmp_path):
    """What the run controller stored with the checkpoint (its rollbacks, the learning-rate damping they left) comes
    back with it, for the resumed controller (issue 43); a checkpoint stored without one gives a fresh run's."""
    storage = Storage(tmp_path / "run-2")
    infos, params, momentum, *_ = initial_state(SPEC, "run-2", storage, None, resuming=False)
    store = CheckpointStore(storage)
    store.save(Checkpoint(10, params, momentum, meta={"controller": {"rollbacks": 2.0, "lr_damping": 0.25}}))
    assert initial_state(SPEC, "run-2", storage, None, resuming=True).controller == {"rollbacks": 2.0,
                                                                                      "lr_damping": 0.25}
    store.save(Checkpoint(20, params, momentum))  # stored before controllers saved theirs
    assert initial_state(SPEC, "run-2", storage, None, resuming=True).controller == {}
