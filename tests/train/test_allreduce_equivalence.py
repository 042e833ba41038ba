"""All-reduce members equal single-process training, and a re-formation after a loss changes no value.

The reference is plain PyTorch in one process: ``torch.optim`` stepping once per global step on the average of
the members' gradients, member ``r`` of ``n`` computing its own on the ``r``-th run of ``batch`` samples of the
group's cursor in the epoch permutation (:class:`~cmdare.datasets.GroupBatches`). Batch norm normalises each
member's own batch (as DDP without SyncBatchNorm), so each member's gradient is computed separately.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from cmdare.collective import Rendezvous
from cmdare.datasets import GroupBatches, load_dataset
from cmdare.ps.optimizer_config import OptimizerConfig
from cmdare.ps.torch_optimizer import build_optimizer
from cmdare.train import TrainSpec
from cmdare.train.allreduce.replica import Replica
from cmdare.workloads import build_model
from mean_gradient import set_mean_gradient

BATCH, SEED = 16, 3
OPT = OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=5e-4)
# 2 and 4 members: gloo sums in its own order, single-precision rounding after 8 steps stays below this
TOLERANCE = 1e-5


def _spec(**kw) -> TrainSpec:
    return TrainSpec(**{"model": "resnet8", "dataset": "digits", "workers": 1, "steps": 8, "batch_size": BATCH,
                        "seed": SEED, "optimizer": OPT, **kw})


@contextlib.contextmanager
def _one_process(optimizer: str = "sgd", cfg: OptimizerConfig = OPT, global_batch: int | None = None
                 ) -> Iterator[tuple[torch.nn.Module, torch.optim.Optimizer, GroupBatches]]:
    """The reference's set-up, on one thread: the members' initial model, its optimizer and the group's batches."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = load_dataset("digits", seed=SEED)
        torch.manual_seed(SEED)
        model = build_model("resnet8", num_classes=data.num_classes, in_channels=data.input_shape[0])
        opt = build_optimizer(optimizer, model.parameters(), cfg)
        model.train()
        yield model, opt, GroupBatches((data.train_x, data.train_y), BATCH, SEED, global_batch=global_batch)
    finally:
        torch.set_num_threads(threads)


def _pieces(batches: GroupBatches, size: int) -> tuple[list, list[float]]:
    """Each of ``size`` members' batch of the group's next step, and its share of a global batch (0 without)."""
    where, pieces, weights = batches.where, [], []
    for rank in range(size):
        batches.seek(*where)
        batches.regroup(rank, size)
        weights.append(batches.piece()[1] / batches.global_batch if batches.global_batch else 0.0)
        pieces.append(next(batches))
    return pieces, weights


def _flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def _reference(sizes: list[int], optimizer: str = "sgd", cfg: OptimizerConfig = OPT,
               global_batch: int | None = None, clip: float | None = None, bf16: bool = False) -> np.ndarray:
    """One process: ``sizes[t]`` members' gradients averaged at step ``t`` (with a ``global_batch``: each weighed
    by its share of it), then one optimizer step."""
    with _one_process(optimizer, cfg, global_batch) as (model, opt, batches):
        for t, size in enumerate(sizes):
            pieces, weights = _pieces(batches, size)
            set_mean_gradient(model, pieces, weights if global_batch else None,
                              (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for group in opt.param_groups:
                group["lr"] = cfg.lr_at(t)
            opt.step()
        return _flat(model)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_one_member_equals_torch_optim_bit_for_bit(optimizer):
    """A group of one runs no collective: its parameters are torch.optim's, exactly."""
    rendezvous = Rendezvous()
    try:
        member = Replica(_spec(), rendezvous.address, optimizer=optimizer, threads=1)
        assert member.form(0, 0, 1)
        result = member.run_steps(8)
        assert result.steps == 8 and result.lost is None and result.step == 8
        np.testing.assert_array_equal(member.params(), _reference([1] * 8, optimizer))
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
        rendezvous.close()


def test_one_member_with_clipping_warmup_and_cosine_equals_torch_optim_bit_for_bit():
    """``--clip-grad-norm`` (torch.nn.utils.clip_grad_norm_ on the group's gradient) and a warm-up then cosine
    schedule of the global step: exactly torch's."""
    cfg = OptimizerConfig(lr=0.08, momentum=0.9, weight_decay=5e-4, schedule="cosine", warmup_steps=3, total_steps=8)
    rendezvous = Rendezvous()
    try:
        member = Replica(_spec(optimizer=cfg, clip_grad_norm=0.5), rendezvous.address, threads=1)
        assert member.form(0, 0, 1)
        assert member.run_steps(8).step == 8
        np.testing.assert_array_equal(member.params(), _reference([1] * 8, cfg=cfg, clip=0.5))
        assert not np.array_equal(member.params(), _reference([1] * 8, cfg=cfg))  # the clipping acted
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
        rendezvous.close()


def test_one_member_in_amp_bf16_equals_torch_autocast_bit_for_bit():
    """``--precision amp-bf16``: the forward pass and the loss under ``torch.autocast`` in bfloat16, the gradient
    and the optimizer in fp32: exactly torch's, and not fp32's."""
    rendezvous = Rendezvous()
    try:
        member = Replica(_spec(precision="amp-bf16"), rendezvous.address, threads=1)
        assert member.form(0, 0, 1)
        assert member.run_steps(8).step == 8
        np.testing.assert_array_equal(member.params(), _reference([1] * 8, bf16=True))
        assert not np.array_equal(member.params(), _reference([1] * 8))
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
        rendezvous.close()


def _fp16_reference(size: int, steps: int, scale: float) -> tuple[np.ndarray, float, int]:
    """One process, ``size`` members' float16 gradients of the loss times ``scale`` averaged, then
    ``torch.amp.GradScaler``'s policy on that average: an overflow skips the step (its batches taken) and halves
    the scale. Returns the parameters after ``steps`` steps taken, the scale, and the steps skipped."""
    with _one_process() as (model, opt, batches):
        scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        taken = skipped = 0
        while taken < steps:
            set_mean_gradient(model, _pieces(batches, size)[0], None,
                              lambda: torch.autocast("cpu", dtype=torch.float16), scale=scaler.scale)
            for group in opt.param_groups:
                group["lr"] = OPT.lr_at(taken)
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < before:
                skipped += 1
            else:
                taken += 1
        return _flat(model), scaler.get_scale(), skipped


def test_one_member_in_amp_fp16_equals_torch_grad_scaler_bit_for_bit():
    """``--precision amp-fp16``: autocast in float16, the loss scaled before backward, the gradient unscaled and
    checked after it. From a scale of 2^40 the first backward passes overflow: those steps are skipped, their
    batches taken, the scale halved each time, exactly as ``torch.amp.GradScaler`` does; then 8 steps are taken.
    A member that heals from this one takes its scale."""
    rendezvous = Rendezvous()
    try:
        spec = _spec(precision="amp-fp16")
        member = Replica(spec, rendezvous.address, threads=1)
        member.loss_scale.scale = 2.0**40
        assert member.form(0, 0, 1)
        chunk = member.run_steps(8)
        params, scale, skipped = _fp16_reference(1, 8, 2.0**40)
        assert chunk.step == 8 and chunk.overflow_skips == skipped >= 10
        assert chunk.loss_scale == scale == 2.0 ** (40 - skipped)
        np.testing.assert_array_equal(member.params(), params)
        newcomer = Replica(spec, rendezvous.address, threads=1)
        newcomer._load_state(member._state_bytes())
        assert newcomer.loss_scale.state_dict() == member.loss_scale.state_dict()
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
        rendezvous.close()


@contextlib.contextmanager
def _group(ray) -> Iterator[Callable[..., list]]:
    """``start(n, **replica_options)`` starts ``n`` members meeting at one rendezvous; every member it started is
    ended, and the rendezvous closed, at the end."""
    rendezvous = Rendezvous()
    actor = ray.remote(num_cpus=1)(Replica)
    started: list = []

    def start(n: int, spec: TrainSpec | None = None, **kw) -> list:
        new = [actor.remote(spec or _spec(), rendezvous.address, threads=1, member_seed=len(started) + r, **kw)
               for r in range(n)]
        started.extend(new)
        return new

    try:
        yield start
    finally:
        for m in started:
            ray.kill(m)
        rendezvous.close()


def _form(ray, members, epoch: int) -> None:
    assert all(ray.get([m.form.remote(epoch, r, len(members)) for r, m in enumerate(members)], timeout=60))


@pytest.mark.parametrize("n", [2, 4])
def test_members_equal_single_process_sgd_on_their_averaged_batches(local_ray, n):
    ray = local_ray
    with _group(ray) as start:
        members = start(n)
        _form(ray, members, 0)
        results = ray.get([m.run_steps.remote(8) for m in members], timeout=120)
        assert [r.steps for r in results] == [8] * n and not any(r.lost for r in results)
        params = ray.get([m.params.remote() for m in members])
        for p in params[1:]:  # every member applied the same averaged gradient: identical replicas
            np.testing.assert_array_equal(p, params[0])
        np.testing.assert_allclose(params[0], _reference([n] * 8), rtol=0, atol=TOLERANCE)
        assert len({ray.get(m.position.remote()) for m in members}) == 1


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_lost_member_costs_the_step_in_flight_and_nothing_else(local_ray, how):
    """3 members train 4 steps; one dies (or freezes: SIGSTOP) before the 5th. The survivors' 5th step fails within
    the deadline, they re-form at 2 with a new epoch and train on from their own state: the result equals a run
    sized 3 for 4 steps and 2 from there."""
    ray = local_ray
    with _group(ray) as start, contextlib.ExitStack() as stack:
        members = start(3, deadline_s=2.0)
        _form(ray, members, 0)
        assert [r.steps for r in ray.get([m.run_steps.remote(4) for m in members], timeout=120)] == [4] * 3
        victim = members.pop()
        pid = ray.get(victim.__ray_call__.remote(lambda self: os.getpid()))
        if how == "frozen":  # a stopped process ends only by SIGKILL (this test's own member, by its PID)
            stack.callback(os.kill, pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        t0 = time.monotonic()
        results = ray.get([m.run_steps.remote(4) for m in members], timeout=60)
        waited = time.monotonic() - t0
        assert [r.steps for r in results] == [0, 0] and all(r.lost for r in results), results
        assert waited < 2.0 + 3.0, f"the survivors waited {waited:.1f} s for a {how} peer (deadline 2 s)"
        _form(ray, members, 1)
        assert all(ray.get([m.heal.remote(0) for m in members]))
        results = ray.get([m.run_steps.remote(4) for m in members], timeout=120)
        assert [r.step for r in results] == [8, 8]
        np.testing.assert_allclose(ray.get(members[0].params.remote()), _reference([3] * 4 + [2] * 4),
                                   rtol=0, atol=TOLERANCE)


def test_a_newcomer_heals_from_a_peer_and_the_data_goes_on_without_a_gap(local_ray):
    """2 members train 3 steps; a newcomer joins at epoch 1, takes member 0's state (parameters, optimizer state,
    step, data position) and the 3 train on: equal to a run sized 2 then 3, every sample of the epoch taken once."""
    ray = local_ray
    with _group(ray) as start:
        members = start(2, optimizer="adamw")
        _form(ray, members, 0)
        ray.get([m.run_steps.remote(3) for m in members], timeout=120)
        members += start(1, optimizer="adamw")
        _form(ray, members, 1)
        assert all(ray.get([m.heal.remote(0) for m in members]))
        assert len({ray.get(m.position.remote()) for m in members}) == 1
        results = ray.get([m.run_steps.remote(3) for m in members], timeout=120)
        assert [r.step for r in results] == [6, 6, 6]
        params = ray.get([m.params.remote() for m in members])
        np.testing.assert_array_equal(params[2], params[0])
        np.testing.assert_allclose(params[0], _reference([2] * 3 + [3] * 3, "adamw"), rtol=0, atol=TOLERANCE)


def test_members_in_amp_fp16_skip_the_same_overflowing_steps_and_equal_one_process(local_ray):
    """2 members from a loss scale of 2^40: an overflow in either makes the averaged gradient non-finite on both,
    so both skip the same steps and halve the same scale; the group equals one process applying GradScaler's
    policy to the averaged float16 gradient (within the tolerance of the sum's order)."""
    ray = local_ray
    with _group(ray) as start:
        members = start(2, spec=_spec(precision="amp-fp16"))
        ray.get([m.__ray_call__.remote(lambda self: setattr(self.loss_scale, "scale", 2.0**40)) for m in members])
        _form(ray, members, 0)
        chunks = ray.get([m.run_steps.remote(8) for m in members], timeout=120)
        params, scale, skipped = _fp16_reference(2, 8, 2.0**40)
        assert [(c.step, c.overflow_skips, c.loss_scale) for c in chunks] == [(8, skipped, scale)] * 2
        assert skipped >= 10
        held = ray.get([m.params.remote() for m in members])
        np.testing.assert_array_equal(held[1], held[0])
        np.testing.assert_allclose(held[0], params, rtol=0, atol=TOLERANCE)


def test_group_batches_take_every_sample_of_an_epoch_once_across_sizes():
    """Sizes 2, 3, 1, 4 in turn over a whole epoch: no index twice, none missing beyond the dropped tail."""
    data = (torch.arange(100).float().reshape(100, 1), torch.arange(100))
    batches = GroupBatches(data, 4, seed=7)
    seen: list[int] = []
    sizes = [2, 3, 1, 4] * 10
    for size in sizes:
        where = batches.where
        if where[0] > 0:
            break
        for rank in range(size):
            batches.seek(*where)
            batches.regroup(rank, size)
            if batches.step_indices().numel() and batches._fit()[0] == 0:
                seen += batches.step_indices().tolist()
            next(batches)
    assert len(seen) == len(set(seen))
    assert len(seen) >= 100 - 4 * 4  # the tail dropped is less than one step of the largest group


def test_a_group_that_keeps_its_global_batch_equals_one_process_on_it_across_a_loss(local_ray):
    """``global_batch=48``: 3 members train 16 samples each, then 2 train 24 each; each gradient weighs its share,
    so every step is the global batch's mean gradient whatever the size."""
    ray = local_ray
    with _group(ray) as start:
        members = start(3, global_batch=3 * BATCH)
        _form(ray, members, 0)
        ray.get([m.run_steps.remote(3) for m in members], timeout=120)
        gone = members.pop()
        ray.kill(gone)
        _form(ray, members, 1)
        results = ray.get([m.run_steps.remote(3) for m in members], timeout=120)
        assert [r.step for r in results] == [6, 6]
        np.testing.assert_allclose(ray.get(members[0].params.remote()),
                                   _reference([3] * 3 + [2] * 3, global_batch=3 * BATCH), rtol=0, atol=TOLERANCE)
        assert ray.get(members[0].position.remote())[2] == 6 * 3 * BATCH  # 48 samples a step, whatever the size


def test_a_global_batch_is_cut_into_pieces_that_differ_by_at_most_one_sample():
    data = (torch.arange(200).float().reshape(200, 1), torch.arange(200))
    batches = GroupBatches(data, 4, seed=1, global_batch=50)
    pieces = []
    for rank in range(3):
        batches.regroup(rank, 3)
        pieces.append(batches.piece())
    assert pieces == [(0, 17), (17, 17), (34, 16)]
    assert batches.step_samples == 50
