"""Workers draw their own random streams (issue 42): every worker builds the same initial model from the run's
seed, then draws its dropout masks from a stream seeded by the seed and its data slot, so two workers' masks
differ, and the same slot and seed give the same masks again (a replacement, a rerun)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import get_placement
from cmdare.tasks.seeding import slot_seed
from cmdare.train import TrainSpec
from cmdare.train.workers.worker import Worker

PROJECT = Path(__file__).parents[1] / "workloads" / "user_project"


@pytest.fixture(autouse=True)
def _user_project(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))
    monkeypatch.setenv("CMDARE_TCP", "0")  # no shards to reach: a worker outside Ray opens no channel


def _worker(spec: TrainSpec, slot: int) -> Worker:
    """Data slot ``slot`` of 2 as a plain object (outside Ray: no shard channels, no notice watchers)."""
    model = spec.task().build()
    placement = get_placement("round-robin").place(param_infos((n, p.shape) for n, p in model.named_parameters()), 1)
    return Worker(slot, slot, 2, spec, [None], placement)


def _first_step(worker: Worker, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The worker's initial parameters, and its model's output in training (dropout on) right after joining."""
    params = torch.cat([p.detach().reshape(-1) for p in worker.model.parameters()])
    worker.model.train()
    with torch.no_grad():
        return params, worker.model(x)


def test_two_workers_draw_different_dropout_masks_from_the_same_initial_model():
    spec = TrainSpec(model="wordlm.model:build_lstm", dataset="wordlm.data:make_sets", loss="wordlm.data:nll",
                     workers=2, seed=4)
    x, _ = next(spec.task().stream(0, 1, 2, 4))
    params0, out0 = _first_step(_worker(spec, 0), x)
    params1, out1 = _first_step(_worker(spec, 1), x)
    assert torch.equal(params0, params1)  # built from the run's seed: the same initial model
    assert not torch.equal(out0, out1)  # ... with masks of their own
    again0, out0_again = _first_step(_worker(spec, 0), x)
    assert torch.equal(again0, params0) and torch.equal(out0_again, out0)  # slot 0 draws the same masks again
    other = TrainSpec(model=spec.model, dataset=spec.dataset, loss=spec.loss, workers=2, seed=5)
    assert not torch.equal(_first_step(_worker(other, 0), x)[1], out0)  # another seed, other masks


def test_slot_seeds_are_distinct_and_fixed():
    seeds = {slot_seed(seed, slot) for seed in range(4) for slot in range(8)}
    assert len(seeds) == 32 and slot_seed(3, 1) == slot_seed(3, 1) and 0 <= slot_seed(0, 0) < 2**63
