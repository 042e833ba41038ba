"""cmdare.datasets: digits (scikit-learn, offline), synthetic CIFAR-shaped tensors, CIFAR-10 batches,
and deterministic sharding of the training data across workers.

    >>> from cmdare.datasets import BatchStream, load_dataset
    >>> ds = load_dataset("digits", image_size=8, channels=1, seed=0)
    >>> x, y = next(BatchStream(ds, worker_index=0, num_workers=2, batch_size=32, seed=0))
"""

from __future__ import annotations

from cmdare.datasets.base import (
    Dataset,
    DatasetSpec,
    fit_images,
    list_datasets,
    load_dataset,
    register_dataset,
)
from cmdare.datasets.builtin import register_builtin_datasets
from cmdare.datasets.group_batches import GroupBatches
from cmdare.datasets.sharding import BatchStream, MapSamples, epoch_permutation

register_builtin_datasets()

__all__ = [
    "BatchStream",
    "Dataset",
    "GroupBatches",
    "DatasetSpec",
    "MapSamples",
    "epoch_permutation",
    "fit_images",
    "list_datasets",
    "load_dataset",
    "register_dataset",
]
