"""The :class:`Dataset` type, the dataset registry and :func:`load_dataset`.

A loader is ``loader(data_dir, num_train, num_test, seed) -> Dataset`` returning the dataset at its
native shape; :func:`load_dataset` then fits it to a CNN's input (``image_size``, ``channels``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cmdare.errors import UnknownNameError, UserInputError

if TYPE_CHECKING:
    import torch

__all__ = ["Dataset", "DatasetSpec", "fit_images", "list_datasets", "load_dataset", "register_dataset"]

RESIZE_MODES = ("resize", "pad")


@dataclass(frozen=True)
class Dataset:
    """An in-memory image classification dataset, normalised, as torch tensors.

    Attributes:
        name: registry name.
        train_x, test_x: float32 ``(N, C, H, W)``.
        train_y, test_y: int64 ``(N,)`` class labels in ``[0, num_classes)``.
        num_classes: number of classes.
        input_shape: ``(C, H, W)`` of one sample.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, int, int]

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test samples."""
        return int(self.test_x.shape[0])


Loader = Callable[[Path | None, int, int, int], Dataset]


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: name, loader and a one-line description."""

    name: str
    loader: Loader
    description: str = ""


_REGISTRY: dict[str, DatasetSpec] = {}


def register_dataset(
    name: str, loader: Loader, description: str = "", *, replace: bool = False
) -> DatasetSpec:
    """Register ``loader(data_dir, num_train, num_test, seed) -> Dataset`` under ``name``.

    Raises:
        UserInputError: the name is already taken and ``replace`` is false.
    """
    if name in _REGISTRY and not replace:
        raise UserInputError(f"dataset {name!r} is already registered")
    spec = DatasetSpec(name, loader, description)
    _REGISTRY[name] = spec
    return spec


def list_datasets() -> list[str]:
    """Names of the registered datasets."""
    return list(_REGISTRY)


def fit_images(
    x: torch.Tensor, image_size: int | None = None, channels: int | None = None, mode: str = "resize"
) -> torch.Tensor:
    """Fit ``(N, C, H, W)`` images to a CNN's input.

    Args:
        x: float images.
        image_size: target height = width; ``None`` keeps the size. ``mode="resize"`` interpolates
            bilinearly (``F.interpolate``, both up and down); ``mode="pad"`` zero-pads evenly around
            the image (only growing; after normalisation 0 is the mean value).
        channels: target channels; ``None`` keeps them. 1 -> C repeats the channel; C -> 1 averages.
        mode: ``"resize"`` or ``"pad"``.

    Raises:
        UserInputError: an impossible size or channel change, or an unknown mode.
    """
    import torch.nn.functional as F

    if mode not in RESIZE_MODES:
        raise UserInputError(f"resize mode must be one of {', '.join(RESIZE_MODES)}, got {mode!r}")
    if channels is not None:
        c = x.shape[1]
        if channels < 1:
            raise UserInputError(f"channels must be >= 1, got {channels}")
        if channels != c:
            if c == 1:
                x = x.repeat(1, channels, 1, 1)
            elif channels == 1:
                x = x.mean(dim=1, keepdim=True)
            else:
                raise UserInputError(f"cannot turn {c} channels into {channels}")
    if image_size is not None:
        h, w = x.shape[2], x.shape[3]
        if image_size < 1:
            raise UserInputError(f"image_size must be >= 1, got {image_size}")
        if (h, w) != (image_size, image_size):
            if mode == "resize":
                x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
            else:
                if image_size < max(h, w):
                    raise UserInputError(f"cannot pad {h}x{w} images down to {image_size}")
                top, left = (image_size - h) // 2, (image_size - w) // 2
                x = F.pad(x, (left, image_size - w - left, top, image_size - h - top))
    return x.contiguous()


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    image_size: int | None = None,
    channels: int | None = None,
    num_train: int = 5000,
    num_test: int = 1000,
    seed: int = 0,
    resize_mode: str = "resize",
) -> Dataset:
    """Load a dataset by name, normalised and fitted to a CNN's input.

    Args:
        name: ``"digits"`` (scikit-learn, 1x8x8, 1437/360 train/test), ``"synthetic"`` (3x32x32,
            learnable labels) or ``"cifar10"`` (python pickle batches in ``data_dir``).
        data_dir: directory with the files (cifar10 only).
        image_size: square target size (see :func:`fit_images`); ``None`` keeps the native size.
        channels: target channels; ``None`` keeps the native channels.
        num_train, num_test: sample counts for ``synthetic`` (the real datasets use their full splits).
        seed: seeds the digits train/test split and the synthetic data.
        resize_mode: ``"resize"`` (interpolate) or ``"pad"`` (zero-pad) for ``image_size``.

    Returns:
        A frozen :class:`Dataset`.

    Raises:
        UnknownNameError: unknown dataset name.
        DataNotFoundError: cifar10's directory or files are missing.
        DataFormatError: a cifar10 file cannot be parsed.
        UserInputError: bad sizes or counts.
    """
    try:
        spec = _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownNameError("dataset", str(name), list(_REGISTRY)) from None
    for label, value in (("num_train", num_train), ("num_test", num_test)):
        if not isinstance(value, int) or value < 1:
            raise UserInputError(f"{label} must be a positive integer, got {value!r}")
    ds = spec.loader(Path(data_dir).expanduser() if data_dir is not None else None, num_train, num_test, seed)
    if image_size is None and channels is None:
        return ds
    train_x = fit_images(ds.train_x, image_size, channels, resize_mode)
    test_x = fit_images(ds.test_x, image_size, channels, resize_mode)
    return replace(ds, train_x=train_x, test_x=test_x, input_shape=tuple(train_x.shape[1:]))
