"""BatchStream: deterministic, disjoint, resumable sharding of the training data."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from cmdare.datasets import BatchStream, load_dataset
from cmdare.errors import UserInputError


def _data(n: int = 103) -> tuple[torch.Tensor, torch.Tensor]:
    # Row i of x holds the value i, so a batch reveals its sample indices.
    return torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 8, 8).contiguous(), torch.arange(n)


def _take(stream: BatchStream, n: int) -> list[torch.Tensor]:
    return [y for _, y in itertools.islice(stream, n)]


def test_batches_are_fully_determined_by_their_arguments() -> None:
    a = _take(BatchStream(_data(), 1, 3, 5, seed=7), 12)
    b = _take(BatchStream(_data(), 1, 3, 5, seed=7), 12)
    c = _take(BatchStream(_data(), 1, 3, 5, seed=8), 12)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not all(torch.equal(u, v) for u, v in zip(a, c, strict=True))
    x, y = next(BatchStream(_data(), 0, 1, 4, seed=0))
    assert torch.equal(x[:, 0, 0, 0].long(), y)  # x and y stay paired


def test_workers_get_disjoint_shards_and_each_epoch_reshuffles() -> None:
    workers = [BatchStream(_data(), w, 3, 5, seed=1) for w in range(3)]
    per_epoch = workers[0].batches_per_epoch
    assert per_epoch == (103 // 3) // 5 == 6
    epoch0 = [torch.cat(_take(s, per_epoch)) for s in workers]
    seen = torch.cat(epoch0)
    assert len(seen) == len(set(seen.tolist())) == 3 * 6 * 5  # disjoint, no repeats within an epoch
    assert all(s.epoch == 1 and s.position == per_epoch for s in workers)
    epoch1 = torch.cat(_take(workers[0], per_epoch))
    assert not torch.equal(epoch1, epoch0[0])


def test_one_worker_equals_a_plain_loop_over_the_same_permutations() -> None:
    x, y = _data(50)
    stream = BatchStream((x, y), 0, 1, 8, seed=4)
    expected = []
    for epoch in range(3):
        perm = torch.from_numpy(np.random.default_rng([4, epoch]).permutation(50))
        expected += [perm[i * 8 : (i + 1) * 8] for i in range(50 // 8)]
    got = _take(stream, len(expected))  # promised exactly (sharding.py)
    np.testing.assert_array_equal(torch.stack(got).numpy(), torch.stack(expected).numpy())


def test_sync_workers_together_see_the_single_process_large_batch() -> None:
    """Promised exactly (sharding.py): batch t of the K workers holds exactly the samples of batch t of
    one stream with K times the batch, interleaved: worker w's batch is ``big[w::K]``."""
    k, bs = 3, 4
    single = BatchStream(_data(), 0, 1, k * bs, seed=2)
    workers = [BatchStream(_data(), w, k, bs, seed=2) for w in range(k)]
    assert single.batches_per_epoch == workers[0].batches_per_epoch
    for _ in range(2 * single.batches_per_epoch + 1):  # across an epoch boundary
        _, big = next(single)
        for w, s in enumerate(workers):
            np.testing.assert_array_equal(next(s)[1].numpy(), big[w::k].numpy())


def test_skip_seek_and_start_batch_resume_exactly() -> None:
    full = _take(BatchStream(_data(), 2, 4, 3, seed=5), 30)
    resumed = BatchStream(_data(), 2, 4, 3, seed=5, start_batch=17)
    assert all(torch.equal(u, v) for u, v in zip(_take(resumed, 13), full[17:], strict=True))
    skipper = BatchStream(_data(), 2, 4, 3, seed=5)
    _take(skipper, 2)
    assert skipper.skip(20).position == 22 and torch.equal(next(skipper)[1], full[22])
    assert torch.equal(next(skipper.seek(5))[1], full[5])
    assert torch.equal(skipper.batch_indices(9), full[9])


def test_accepts_a_dataset() -> None:
    ds = load_dataset("synthetic", num_train=64, num_test=8)
    x, y = next(BatchStream(ds, 0, 2, 16, seed=0))
    assert x.shape == (16, 3, 32, 32) and y.shape == (16,)


@pytest.mark.parametrize(
    ("worker", "workers", "batch", "seed"),
    [(0, 0, 4, 0), (2, 2, 4, 0), (-1, 2, 4, 0), (0, 1, 0, 0), (0, 1, 4, -1), (0, 30, 4, 0), (0, 1, 200, 0)],
)
def test_bad_arguments(worker: int, workers: int, batch: int, seed: int) -> None:
    with pytest.raises(UserInputError):
        BatchStream(_data(), worker, workers, batch, seed)


def test_bad_resume_arguments() -> None:
    stream = BatchStream(_data(), 0, 1, 4, seed=0)
    with pytest.raises(UserInputError):
        stream.skip(-1)
    with pytest.raises(UserInputError):
        stream.seek(-2)
    with pytest.raises(UserInputError):
        BatchStream(_data(), 0, 1, 4, seed=0, start_batch=-1)
    with pytest.raises(UserInputError):
        BatchStream((torch.zeros(5, 1, 8, 8), torch.zeros(4, dtype=torch.long)), 0, 1, 2, seed=0)
