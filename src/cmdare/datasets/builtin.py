"""The built-in datasets: scikit-learn digits, synthetic CIFAR-shaped tensors, CIFAR-10 python batches."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from cmdare.datasets.base import Dataset, register_dataset
from cmdare.errors import DataFormatError, DataNotFoundError

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "load_cifar10", "load_digits", "load_synthetic"]

# Per-channel mean and std of the CIFAR-10 training set (values commonly used with torchvision).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
DIGITS_TEST_FRACTION = 0.2


def load_digits(data_dir: Path | None, num_train: int, num_test: int, seed: int) -> Dataset:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes), a seeded 80/20 split.

    Pixels (0..16) are standardised with the training split's mean and std. ``num_train``/``num_test``
    are ignored: the dataset is used whole.
    """
    import torch

    x, y = _digits_arrays()
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = round(len(y) * DIGITS_TEST_FRACTION)
    test_idx, train_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    mean, std = float(x[train_idx].mean()), float(x[train_idx].std())
    x = (x - mean) / std
    tx = torch.from_numpy(x[:, None, :, :])
    ty = torch.from_numpy(y)
    return Dataset(
        "digits",
        tx[train_idx].contiguous(),
        ty[train_idx].contiguous(),
        tx[test_idx].contiguous(),
        ty[test_idx].contiguous(),
        10,
        (1, 8, 8),
    )


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images float32 [n, 8, 8], labels int64), read from the data file it
    ships without importing scikit-learn (~1 s of a replacement worker's start-up)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is not None and path.is_file():
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",", dtype=np.float64)
        return data[:, :-1].reshape(-1, 8, 8).astype(np.float32), data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    return bunch.images.astype(np.float32), bunch.target.astype(np.int64)


def load_synthetic(data_dir: Path | None, num_train: int, num_test: int, seed: int) -> Dataset:
    """CIFAR-shaped 3x32x32 random images whose labels are learnable.

    Each of the 10 classes has a fixed random smooth prototype (4x4 noise upsampled to 32x32); a
    sample is its class prototype plus unit Gaussian noise. The classes are easy to separate (a
    nearest-class-mean rule is ~100% accurate): the data exist for speed work, not accuracy claims.
    Deterministic in ``seed``; train and test share the prototypes and the training statistics.
    """
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(int(seed))
    protos = F.interpolate(
        torch.randn(10, 3, 4, 4, generator=gen), size=(32, 32), mode="bilinear", align_corners=False
    )

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int64)
        return protos[y] + torch.randn(n, 3, 32, 32, generator=gen), y

    train_x, train_y = make(num_train)
    test_x, test_y = make(num_test)
    mean, std = train_x.mean(), train_x.std()  # normalise both splits with the training statistics
    train_x, test_x = ((train_x - mean) / std).contiguous(), ((test_x - mean) / std).contiguous()
    return Dataset("synthetic", train_x, train_y, test_x, test_y, 10, (3, 32, 32))


#: The only globals a CIFAR-10 python batch names (numpy arrays and their dtypes, as pickled by Python 2's
#: cPickle and by Python 3 at any protocol; ``_codecs.encode`` is how protocol 2 writes bytes from Python 3).
#: Dicts, lists, strings, bytes and ints need no global.
_CIFAR_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
})


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only what a CIFAR-10 batch holds: anything else (a function to call, a class
    to build) is refused before it runs."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _CIFAR_GLOBALS:
            raise _RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


class _RefusedGlobal(pickle.UnpicklingError):
    pass


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataNotFoundError(f"CIFAR-10 batch file not found: {path}")
    try:
        with path.open("rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
        batch = {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except _RefusedGlobal as err:
        raise DataFormatError(f"refusing to read {path}: it asks to load {err}, which a CIFAR-10 batch never "
                              "does (a batch holds only arrays, lists, strings and numbers)") from None
    except Exception as err:  # pickle raises many types on a corrupt file
        raise DataFormatError(f"not a CIFAR-10 python batch file: {path} ({type(err).__name__})") from err
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise DataFormatError(
            f"CIFAR-10 batch {path} has data {data.shape} and {len(labels)} labels; "
            "need (N, 3072) and N labels"
        )
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise DataFormatError(f"CIFAR-10 batch {path} has labels outside 0..9")
    return data, labels


def cifar10_dir(data_dir: Path | None) -> Path:
    """The directory holding the six CIFAR-10 batches: ``data_dir`` or its ``cifar-10-batches-py``.

    Raises:
        DataNotFoundError: no directory, or one of the six files is missing.
    """
    root = _cifar_dir(data_dir)
    missing = [n for n in (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE) if not (root / n).is_file()]
    if missing:
        raise DataNotFoundError(f"CIFAR-10 files missing in {root}: {', '.join(missing)}")
    return root


def _cifar_dir(data_dir: Path | None) -> Path:
    if data_dir is None:
        raise DataNotFoundError("cifar10 needs a data directory (--data-dir) with the python batches")
    if not data_dir.is_dir():
        raise DataNotFoundError(f"CIFAR-10 directory not found: {data_dir}")
    nested = data_dir / "cifar-10-batches-py"  # accept the archive's parent directory too
    if not (data_dir / CIFAR10_TEST_FILE).exists() and nested.is_dir():
        return nested
    return data_dir


def load_cifar10(data_dir: Path | None, num_train: int, num_test: int, seed: int) -> Dataset:
    """CIFAR-10 from the standard python pickle batches ``data_batch_1..5`` and ``test_batch``.

    ``data_dir`` is the directory holding them (or its parent holding ``cifar-10-batches-py``).
    Images are scaled to [0, 1] and normalised per channel with :data:`CIFAR10_MEAN`/:data:`CIFAR10_STD`.
    ``num_train``/``num_test``/``seed`` are ignored: the dataset is used whole, in file order.

    Raises:
        DataNotFoundError: the directory or one of the six files is missing.
        DataFormatError: a file is not a CIFAR-10 batch.
    """
    import torch

    root = cifar10_dir(data_dir)
    train = [_read_batch(root / n) for n in CIFAR10_TRAIN_FILES]
    test_data, test_labels = _read_batch(root / CIFAR10_TEST_FILE)
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)

    def to_x(data: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(data).view(-1, 3, 32, 32).float().div_(255.0)
        return ((x - mean) / std).contiguous()

    train_x = to_x(np.concatenate([d for d, _ in train]))
    train_y = torch.from_numpy(np.concatenate([lab for _, lab in train]))
    return Dataset(
        "cifar10", train_x, train_y, to_x(test_data), torch.from_numpy(test_labels), 10, (3, 32, 32)
    )


def register_builtin_datasets() -> None:
    """Register the built-in datasets (idempotent)."""
    register_dataset(
        "digits", load_digits, "scikit-learn digits, 1x8x8, 10 classes, 80/20 split", replace=True
    )
    register_dataset(
        "synthetic", load_synthetic, "random CIFAR-shaped 3x32x32, learnable labels", replace=True
    )
    register_dataset("cifar10", load_cifar10, "CIFAR-10 python batches from --data-dir", replace=True)
