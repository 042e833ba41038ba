"""Checkpoints on every backend: data first, manifest last, verified on load, rotated, never half-valid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cmdare.errors import CheckpointError, StorageError
from cmdare.storage import Storage
from cmdare.train.checkpoint import Checkpoint, CheckpointStore, latest_checkpoint, load_checkpoint


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
    store.save(_ckpt(30))
    assert len(_data(st)) == 2 and [json.loads(st.get(m))["step"] for m in store.manifests()] == [10, 30]
