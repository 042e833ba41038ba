"""The CIFAR-10 python-batch loader, on tiny batch files the test writes with pickle."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from cmdare.datasets import load_dataset
from cmdare.datasets.builtin import CIFAR10_MEAN, CIFAR10_STD
from cmdare.errors import DataFormatError, DataNotFoundError

FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _write_batches(root: Path, per_file: int = 4, byte_keys: bool = True) -> dict[str, tuple[np.ndarray, list[int]]]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    written = {}
    for i, name in enumerate(FILES):
        data = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
        labels = [(i + j) % 10 for j in range(per_file)]
        batch = {b"data": data, b"labels": labels} if byte_keys else {"data": data, "labels": labels}
        with (root / name).open("wb") as f:
            pickle.dump(batch, f)
        written[name] = (data, labels)
    return written


def test_reads_the_standard_batches(tmp_path: Path) -> None:
    written = _write_batches(tmp_path / "cifar-10-batches-py")
    for root in (tmp_path / "cifar-10-batches-py", tmp_path):  # the folder itself or its parent
        ds = load_dataset("cifar10", root)
        assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
        assert (ds.num_train, ds.num_test) == (20, 4)
        assert ds.train_y.dtype == torch.int64 and ds.train_x.dtype == torch.float32
        assert ds.train_y.tolist() == sum((written[n][1] for n in FILES[:5]), [])
        assert ds.test_y.tolist() == written["test_batch"][1]
    # Pixel (channel 1, row 2, col 3) of the first test image: CIFAR rows are R plane, G plane, B plane.
    raw = written["test_batch"][0][0].reshape(3, 32, 32)[1, 2, 3]
    expected = (raw / 255.0 - CIFAR10_MEAN[1]) / CIFAR10_STD[1]
    assert float(ds.test_x[0, 1, 2, 3]) == pytest.approx(expected, rel=1e-5)


def test_str_keys_and_resize(tmp_path: Path) -> None:
    _write_batches(tmp_path, per_file=2, byte_keys=False)
    ds = load_dataset("cifar10", str(tmp_path), image_size=16, channels=1)
    assert ds.input_shape == (1, 16, 16) and ds.num_train == 10


def test_missing_directory_or_files(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="none"):
        load_dataset("cifar10", tmp_path / "none")
    with pytest.raises(DataNotFoundError, match="--data-dir"):
        load_dataset("cifar10")
    _write_batches(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DataNotFoundError, match="data_batch_3") as info:
        load_dataset("cifar10", tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"this is not a pickle", pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}),
     pickle.dumps({b"labels": [0]}), pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}),
     pickle.dumps([1, 2, 3])],
)  # fmt: skip
def test_corrupt_file_is_a_format_error(tmp_path: Path, content: bytes) -> None:
    _write_batches(tmp_path)
    (tmp_path / "test_batch").write_bytes(content)
    with pytest.raises(DataFormatError, match="test_batch") as info:
        load_dataset("cifar10", tmp_path)
    assert "\n" not in str(info.value)


class _RunsAShellCommand:
    """A pickle payload: unpickling it calls os.system (what a crafted batch file would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_batches_of_every_pickle_protocol_load(tmp_path: Path, protocol: int) -> None:
    rng = np.random.default_rng(1)
    for name in FILES:
        batch = {b"data": rng.integers(0, 256, size=(3, 3072), dtype=np.uint8), b"labels": [1, 2, 3],
                 b"batch_label": b"training batch 1 of 5", b"filenames": [b"a.png", b"b.png", b"c.png"]}
        (tmp_path / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    assert load_dataset("cifar10", tmp_path).num_train == 15


@pytest.mark.parametrize("where", ["data", "labels", "top"])
def test_a_crafted_batch_cannot_run_code(tmp_path: Path, where: str) -> None:
    """A batch file that would run a shell command when unpickled is refused with one line; nothing runs."""
    _write_batches(tmp_path)
    marker = tmp_path / "ran"
    payload = _RunsAShellCommand(marker)
    batch = payload if where == "top" else {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
    if where != "top":
        batch[f"{where}".encode()] = payload
    (tmp_path / "data_batch_2").write_bytes(pickle.dumps(batch))
    with pytest.raises(DataFormatError, match=r"refusing to read .*data_batch_2: it asks to load (posix|os)\.system"):
        load_dataset("cifar10", tmp_path)
    assert not marker.exists()
    # the same file through plain pickle would have run the command (the test's payload is real)
    pickle.loads((tmp_path / "data_batch_2").read_bytes())
    assert marker.exists()
