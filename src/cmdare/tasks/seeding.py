"""A worker's own random streams: every worker builds the same initial model from the run's seed, then draws
its dropout masks (and any other randomness of the user's code: ``torch``, ``numpy``'s and ``random``'s global
generators) from a stream of its own, seeded from the run's seed and its data slot. So two workers never draw
the same masks, and the same slot and seed draw the same ones again (a replacement of that slot, a rerun)."""

from __future__ import annotations

import random

import numpy as np

__all__ = ["seed_worker", "slot_seed"]


def slot_seed(seed: int, slot: int) -> int:
    """The seed of data slot ``slot``'s random streams in a run of ``seed`` (numpy's ``SeedSequence`` of both:
    distinct slots give unrelated streams)."""
    return int(np.random.SeedSequence([int(seed), int(slot)]).generate_state(1, np.uint64)[0] >> 1)


def seed_worker(seed: int, slot: int) -> int:
    """Seed this process's global generators (torch's on every device, numpy's, ``random``'s) for data slot
    ``slot`` of a run of ``seed``; returns the seed used."""
    import torch

    value = slot_seed(seed, slot)
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
    return value
