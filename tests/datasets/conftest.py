"""Run this folder's tests with one torch thread.

On the 2-core test machine, with other test processes running, torch's default of one intra-op thread
per core makes small forward/backward passes up to 10x slower (threads wait on each other).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
