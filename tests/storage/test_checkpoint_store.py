"""Checkpoints on every backend: data first, manifest last, verified on load, rotated, never half-valid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cmdare.errors import CheckpointError, StorageError
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore, latest_checkpoint, load_checkpoint


def _ckpt(step: int, n: int = 1000) -> Checkpoint:
    rng = np.random.default_rng(step)
    return Checkpoint(step, rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
                      {"bn.running_mean": np.arange(4, dtype=np.float32)}, {"run_id": "r"})


def _data(st: Storage) -> list[str]:
    return st.names(suffix=".npz")


def test_save_load_rotate(storage_url):
    st = Storage(storage_url)
    store = CheckpointStore(st, keep=3)
    for step in (10, 20, 30, 40):
        saved = store.save(_ckpt(step))
        assert saved.url == st.url(saved.name) and saved.size_bytes == len(st.get(saved.name))
    assert store.manifests() == [f"ckpt-{s:09d}.json" for s in (20, 30, 40)]
    assert len(_data(st)) == 3  # the rotated checkpoint's data went with its manifest
    got = store.load()
    want = _ckpt(40)
    assert got.step == 40 and got.meta["run_id"] == "r"
    assert np.array_equal(got.params, want.params) and np.array_equal(got.momentum, want.momentum)
    assert np.array_equal(got.buffers["bn.running_mean"], want.buffers["bn.running_mean"])
    assert load_checkpoint(latest_checkpoint(st)).step == 40  # the same through the path/URL functions
    assert load_checkpoint(st.url("ckpt-000000030.json")).step == 30


def test_rewriting_a_step_switches_at_the_manifest(storage_url):
    st = Storage(storage_url)
    store = CheckpointStore(st)
    first = store.save(_ckpt(10))
    second = store.save(Checkpoint(10, np.ones(3, np.float32), np.zeros(3, np.float32)))
    assert first.name != second.name and _data(st) == [second.name]  # the old data was pruned after the switch
    assert np.array_equal(store.load().params, np.ones(3, np.float32))


def test_corrupt_and_missing_objects_give_one_line_errors(storage_url):
    st = Storage(storage_url)
    store = CheckpointStore(st)
    saved = store.save(_ckpt(10))
    data = bytearray(st.get(saved.name))
    data[-20] ^= 0xFF
    st.put(saved.name, bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch") as err:
        store.load()
    assert "\n" not in str(err.value)
    st.delete(saved.name)
    with pytest.raises(CheckpointError, match="missing its data"):
        store.load()
    st.put("ckpt-000000010.json", b"{oops")
    with pytest.raises(CheckpointError, match="unreadable"):
        store.load()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        CheckpointStore(st.child("empty")).load()


class _ManifestWriteFails(Storage):
    """A real storage whose manifest writes fail, as an upload cut off after its data does."""

    def put(self, name: str, data: bytes) -> None:
        if name.endswith(".json"):
            raise StorageError(f"cannot write {self.url(name)}: connection reset")
        super().put(name, data)


def test_an_interrupted_upload_leaves_the_previous_checkpoint_valid(storage_url):
    CheckpointStore(Storage(storage_url)).save(_ckpt(10))
    cut = _ManifestWriteFails(storage_url)
    with pytest.raises(StorageError, match="connection reset"):
        CheckpointStore(cut).save(_ckpt(20))
    st = Storage(storage_url)
    assert len(_data(st)) == 2  # the cut-off upload's data is there, unnamed by any manifest
    store = CheckpointStore(st)
    assert store.load().step == 10  # ... and does not count
    with pytest.raises(CheckpointError, match="step 20 without a manifest.*--from-step 10"):
        store.resume_point()  # resuming past it is the user's choice
    assert store.resume_point(10) == "ckpt-000000010.json"
    store.save(_ckpt(30))
    # the cut-off data stays while a kept checkpoint is older than it (it may be all that is left of step 20)
    assert len(_data(st)) == 3 and [json.loads(st.get(m))["step"] for m in store.manifests()] == [10, 30]
    store.save(_ckpt(40))
    store.save(_ckpt(50))  # keep 3: 30, 40, 50; now older than every kept checkpoint
    assert sorted(int(n[5:14]) for n in _data(st)) == [30, 40, 50]


def test_a_deleted_newest_manifest_is_reported_and_its_data_kept(storage_url):
    """Issue 29: deleting the newest manifest silently resumed from the previous one, and the rotation
    then deleted the intact newer data."""
    st = Storage(storage_url)
    store = CheckpointStore(st)
    for step in (10, 20, 30):
        store.save(_ckpt(step))
    newest_data = json.loads(st.get("ckpt-000000030.json"))["file"]
    st.delete("ckpt-000000030.json")
    with pytest.raises(CheckpointError, match="step 30 without a manifest.*resume from it with --from-step 20"):
        store.resume_point()
    store.prune()
    assert newest_data in _data(st)  # never rotated away
    assert store.load(store.resume_point(20)).step == 20  # the explicit choice
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 25 .*\(steps: 10, 20\)"):
        store.resume_point(25)


def test_a_manifest_names_only_its_own_runs_data(storage_url, tmp_path):
    st = Storage(storage_url)
    store = CheckpointStore(st)
    saved = store.save(_ckpt(10))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(st.get(saved.name))  # a valid checkpoint, outside the run
    for file in ("../../../outside.bin", str(outside), "ckpt-000000020-abcdef.npz", "notes.npz", 7):
        manifest = json.loads(st.get("ckpt-000000010.json"))
        st.put("ckpt-000000010.json", json.dumps(dict(manifest, file=file)).encode())
        with pytest.raises(CheckpointError, match="not this run's checkpoint of its step: refused") as err:
            store.load()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["empty", "short_momentum", "nan_params", "inf_momentum", "nan_buffers"])
def test_bad_checkpoint_contents_are_one_line_errors(storage_url, bad):
    """A 0-byte data file with a matching manifest ended with 'Aborted.'; a checkpoint whose momentum is
    shorter than its parameters reached the shards; NaN parameters loaded without complaint."""
    import hashlib

    from cmdare.train.duties.checkpoint import encode_checkpoint

    st = Storage(storage_url)
    store = CheckpointStore(st)
    saved = store.save(_ckpt(10, n=8))
    good = _ckpt(10, n=8)
    if bad == "empty":
        data = b""
    elif bad == "short_momentum":
        data = encode_checkpoint(Checkpoint(10, good.params, good.momentum[:-1]))
    elif bad == "nan_params":
        data = encode_checkpoint(Checkpoint(10, np.full(8, np.nan, np.float32), good.momentum))
    elif bad == "nan_buffers":
        data = encode_checkpoint(Checkpoint(10, good.params, good.momentum, {"bn.running_mean": np.full(2, np.nan)}))
    else:
        data = encode_checkpoint(Checkpoint(10, good.params, np.full(8, np.inf, np.float32)))
    st.put(saved.name, data)  # with a manifest that vouches for it: a store that was written this way
    manifest = json.loads(st.get("ckpt-000000010.json"))
    st.put("ckpt-000000010.json", json.dumps(dict(manifest, size_bytes=len(data),
                                                  sha256=hashlib.sha256(data).hexdigest())).encode())
    with pytest.raises(CheckpointError, match="unreadable") as err:
        store.load()
    assert "\n" not in str(err.value)


def test_a_non_finite_checkpoint_is_never_stored_so_rotation_keeps_the_good_ones(storage_url):
    st = Storage(storage_url)
    store = CheckpointStore(st, keep=2)
    store.save(_ckpt(10))
    store.save(_ckpt(20))
    for bad in (Checkpoint(30, np.full(4, np.nan, np.float32), np.zeros(4, np.float32)),
                Checkpoint(40, np.zeros(4, np.float32), np.array([0, np.inf, 0, 0], np.float32)),
                Checkpoint(50, np.zeros(4, np.float32), np.zeros(4, np.float32),
                           {"bn.running_var": np.array([1.0, np.nan], np.float32),
                            "bn.num_batches_tracked": np.array(7)})):
        with pytest.raises(CheckpointError, match=f"step {bad.step} holds non-finite values"):
            store.save(bad)
    assert store.steps() == [10, 20] and store.load().step == 20
