"""Datasets: digits (real), synthetic, fitting to a CNN's input, registry and bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import cmdare.datasets as dsm
from cmdare.datasets import Dataset, fit_images, list_datasets, load_dataset
from cmdare.errors import UnknownNameError, UserInputError


def test_public_api_is_pinned() -> None:
    assert set(dsm.__all__) == {"BatchStream", "Dataset", "DatasetSpec", "GroupBatches", "MapSamples",
                                "epoch_permutation", "fit_images", "list_datasets", "load_dataset",
                                "register_dataset"}  # fmt: skip
    assert {"digits", "synthetic", "cifar10"} <= set(list_datasets())


def _check(ds: Dataset) -> None:
    assert ds.train_x.dtype == torch.float32 and ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    assert tuple(ds.train_x.shape[1:]) == ds.input_shape == tuple(ds.test_x.shape[1:])
    assert len(ds.train_x) == len(ds.train_y) == ds.num_train and len(ds.test_x) == len(ds.test_y) == ds.num_test
    assert int(ds.train_y.min()) >= 0 and int(ds.train_y.max()) < ds.num_classes
    assert torch.isfinite(ds.train_x).all()


def test_digits_is_a_seeded_80_20_split_of_all_1797_images() -> None:
    ds = load_dataset("digits")
    _check(ds)
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert (ds.num_train, ds.num_test) == (1438, 359)
    assert abs(float(ds.train_x.mean())) < 1e-4 and float(ds.train_x.std()) == pytest.approx(1.0, abs=1e-3)
    assert set(ds.test_y.tolist()) == set(range(10))
    again, other = load_dataset("digits", seed=0), load_dataset("digits", seed=1)
    assert torch.equal(again.train_x, ds.train_x) and torch.equal(again.test_y, ds.test_y)
    assert not torch.equal(other.test_y, ds.test_y)
    # A split: no test image is also a training image.
    train_rows = {tuple(r.tolist()) for r in ds.train_x.flatten(1)}
    overlap = sum(tuple(r.tolist()) in train_rows for r in ds.test_x.flatten(1))
    assert overlap <= 3  # the digits set itself holds a few exact duplicate images


def test_digits_fitted_to_a_cifar_cnn_input() -> None:
    resized = load_dataset("digits", image_size=32, channels=3)
    _check(resized)
    assert resized.input_shape == (3, 32, 32)
    assert torch.equal(resized.train_x[:, 0], resized.train_x[:, 2])
    padded = load_dataset("digits", image_size=12, resize_mode="pad")
    native = load_dataset("digits")
    assert padded.input_shape == (1, 12, 12)
    assert torch.equal(padded.train_x[:, :, 2:10, 2:10], native.train_x)
    assert float(padded.train_x[:, :, :2].abs().sum()) == 0.0


def test_synthetic_is_seeded_and_learnable() -> None:
    ds = load_dataset("synthetic", num_train=600, num_test=200, seed=3)
    _check(ds)
    assert ds.input_shape == (3, 32, 32) and (ds.num_train, ds.num_test) == (600, 200)
    assert torch.equal(load_dataset("synthetic", num_train=600, num_test=200, seed=3).train_x, ds.train_x)
    assert not torch.equal(load_dataset("synthetic", num_train=600, num_test=200, seed=4).train_x, ds.train_x)
    # Learnable: nearest class mean (from train) classifies the test split far above chance (10%).
    means = torch.stack([ds.train_x[ds.train_y == c].mean(0) for c in range(10)]).flatten(1)
    pred = torch.cdist(ds.test_x.flatten(1), means).argmin(1)
    assert float((pred == ds.test_y).float().mean()) > 0.5


def test_fit_images_channels_and_sizes() -> None:
    x = torch.randn(2, 3, 8, 8)
    assert fit_images(x, channels=1).shape == (2, 1, 8, 8)
    assert torch.allclose(fit_images(x, channels=1)[:, 0], x.mean(1))
    assert fit_images(x, image_size=16).shape == (2, 3, 16, 16)
    assert fit_images(x, image_size=4).shape == (2, 3, 4, 4)
    assert torch.equal(fit_images(x), x)
    for kwargs in ({"channels": 2}, {"image_size": 4, "mode": "pad"}, {"image_size": 16, "mode": "crop"},
                   {"image_size": 0}, {"channels": 0}):  # fmt: skip
        with pytest.raises(UserInputError):
            fit_images(x, **kwargs)  # type: ignore[arg-type]


def test_dataset_is_frozen() -> None:
    ds = load_dataset("synthetic", num_train=20, num_test=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.num_classes = 3  # type: ignore[misc]


def test_unknown_name_and_bad_counts() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_dataset("imagenet")
    assert "digits" in str(info.value) and info.value.kind == "dataset"
    with pytest.raises(UserInputError):
        load_dataset("synthetic", num_train=0)


def test_digits_read_from_the_data_file_equal_scikit_learns_loader() -> None:
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sk_digits

    from cmdare.datasets.builtin import _digits_arrays

    x, y = _digits_arrays()
    bunch = sk_digits()
    np.testing.assert_array_equal(x, bunch.images.astype(np.float32))
    np.testing.assert_array_equal(y, bunch.target)
    # and a fresh process loads digits without importing scikit-learn (a replacement worker's start-up)
    code = ("import sys; from cmdare.datasets import load_dataset; load_dataset('digits'); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
