"""Synchronous PS training equals single-process SGD; resume continues exactly.

The reference is plain PyTorch: ``torch.optim.SGD`` (momentum, weight decay, Nesterov) with a
``torch.optim.lr_scheduler`` schedule, stepping once per global step on the average of the ``K``
workers' gradients, each computed on that worker's own data shard (:class:`BatchStream` slot ``w``
of ``K``) for that step.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cmdare.datasets import BatchStream, load_dataset
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.allreduce.optimizer_state import optimizer_arrays
from cmdare.train.callbacks import RunInfo, TrainCallback
from cmdare.train.duties.checkpoint import latest_checkpoint, load_checkpoint
from cmdare.train.workers.worker import Worker
from cmdare.workloads import build_model
from mean_gradient import set_mean_gradient

OPT = OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=5e-4)
# Nesterov momentum, weight decay and a step schedule (lr halves at steps 4 and 8): torch's MultiStepLR
NESTEROV_STEP = OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True, schedule="step",
                                decay_steps=(4, 8), decay_factor=0.5)
# Nesterov, linear warm-up over 3 steps, then cosine decay over 12 steps of the global step
WARMUP_COSINE = OptimizerConfig(lr=0.08, momentum=0.8, weight_decay=1e-3, nesterov=True, schedule="cosine",
                                warmup_steps=3, total_steps=12)
# AdamW (decoupled weight decay) with a linear warm-up and a cosine decay
ADAMW = OptimizerConfig(lr=2e-3, weight_decay=1e-2, schedule="cosine", warmup_steps=3, total_steps=12)
BATCH = 16
SEED = 3


def _spec(ps: int, steps: int, **kw) -> TrainSpec:
    base = dict(model="resnet8", dataset="digits", workers=1, ps=ps, steps=steps, batch_size=BATCH, sync=True,
                optimizer=OPT, checkpoint_every=steps, eval_every=0, seed=SEED, chunk_steps=50)
    base.update(kw)
    return TrainSpec(**base)


def _torch_schedule(sgd: torch.optim.Optimizer, cfg: OptimizerConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """The schedule as torch's own LR schedulers (stepped once after every ``sgd.step()``)."""
    if cfg.schedule == "step" and not cfg.warmup_steps:
        return torch.optim.lr_scheduler.MultiStepLR(sgd, milestones=list(cfg.decay_steps), gamma=cfg.decay_factor)
    if cfg.schedule == "cosine":
        w, t_max = cfg.warmup_steps, cfg.total_steps

        def factor(t: int) -> float:  # linear warm-up to the base lr, then cosine over the global step
            if t < w:
                return (t + 1) / w
            return 0.5 * (1.0 + math.cos(math.pi * min(t, t_max) / t_max))

        return torch.optim.lr_scheduler.LambdaLR(sgd, factor)
    assert cfg.schedule == "constant" and not cfg.warmup_steps, cfg
    return torch.optim.lr_scheduler.LambdaLR(sgd, lambda t: 1.0)


def _reference(steps: int, workers: int = 1, cfg: OptimizerConfig = OPT, seed: int = SEED,
               clip: float | None = None, adamw: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Plain single-process PyTorch SGD; one thread, like a worker with one CPU (thread counts change
    the reduction order in convolutions, and 20 steps amplify that rounding to ~1e-3)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_loop(steps, workers, cfg, seed, clip, adamw)
    finally:
        torch.set_num_threads(threads)


def _reference_loop(steps: int, workers: int, cfg: OptimizerConfig, seed: int, clip: float | None = None,
                    adamw: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The parameters after ``steps``, and (AdamW) the optimizer's state as a checkpoint holds it."""
    data = load_dataset("digits", seed=seed)
    torch.manual_seed(seed)
    model = build_model("resnet8", num_classes=data.num_classes, in_channels=data.input_shape[0])
    params = list(model.parameters())
    sgd = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay) if adamw else \
        torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)
    schedule = _torch_schedule(sgd, cfg)
    streams = [BatchStream(data, w, workers, BATCH, seed) for w in range(workers)]
    model.train()
    for _ in range(steps):  # each worker's gradient on its own shard's batch for this step, averaged
        set_mean_gradient(model, [next(stream) for stream in streams])
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        sgd.step()
        schedule.step()
    return torch.cat([p.detach().reshape(-1) for p in params]).numpy(), optimizer_arrays(sgd, params)[1]


def _final_params(tmp_path) -> np.ndarray:
    return load_checkpoint(latest_checkpoint(tmp_path)).params


def test_one_worker_clipping_its_gradient_equals_torch_sgd_with_clip_grad_norm(local_ray, tmp_path):
    """``--clip-grad-norm`` on a PS: the worker clips its own gradient before it pushes (so it pushes after
    backward); with one worker that is torch.nn.utils.clip_grad_norm_ before each SGD step, bit for bit."""
    steps = 12
    summary = Trainer(_spec(2, steps, clip_grad_norm=0.5, optimizer=WARMUP_COSINE), checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == steps
    got = _final_params(tmp_path)
    np.testing.assert_array_equal(got, _reference(steps, 1, WARMUP_COSINE, clip=0.5)[0])
    assert not np.array_equal(got, _reference(steps, 1, WARMUP_COSINE)[0])  # the clipping acted


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_one_worker_with_adamw_on_the_shards_equals_torch_adamw(local_ray, tmp_path, sync):
    """``--optimizer adamw`` with a PS: the shards run torch.optim.AdamW on their blocks (two shards here), its
    state beside the parameters; with one worker that is plain AdamW with the same warm-up and cosine schedule,
    bit for bit, and the checkpoint holds AdamW's state as torch's optimizer holds it (exact)."""
    steps = 12
    summary = Trainer(_spec(2, steps, optimizer=ADAMW, optimizer_name="adamw", sync=sync),
                      checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == steps
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    params, state = _reference(steps, 1, ADAMW, adamw=True)
    np.testing.assert_array_equal(ckpt.params, params)
    assert sorted(ckpt.optimizer) == sorted(state) and state["exp_avg_sq"].any()
    for key, values in state.items():
        np.testing.assert_array_equal(ckpt.optimizer[key], values, err_msg=key)


def test_an_adamw_checkpoint_of_the_shards_resumes_exactly(local_ray, tmp_path):
    """A PS run with AdamW stopped at step 6 resumes from its checkpoint (AdamW's state gathered from the two
    shards, and put back on them) to step 12: the same parameters as plain AdamW for 12 steps, bit for bit. (The
    checkpoint's AdamW state is the very layout an all-reduce member stores and loads: the test above.)"""
    Trainer(_spec(2, 6, optimizer=ADAMW, optimizer_name="adamw"), checkpoint_dir=tmp_path, run_id="run-a").run()
    resumed = Trainer(_spec(2, 12, optimizer=ADAMW, optimizer_name="adamw"), checkpoint_dir=tmp_path,
                      run_id="run-a", resume=True).run()
    assert resumed.status == "finished" and resumed.global_step == 12
    np.testing.assert_array_equal(_final_params(tmp_path), _reference(12, 1, ADAMW, adamw=True)[0])


def test_resuming_with_another_optimizer_starts_its_state_fresh_and_says_so(local_ray, tmp_path):
    """An SGD run's checkpoint resumed with ``--optimizer adamw``: SGD's momentum means nothing to AdamW, so AdamW
    starts fresh from the checkpoint's parameters (as plain AdamW from them would), and the run says so."""

    class _Events(TrainCallback):
        def __init__(self):
            self.events = []

        def on_event(self, r):
            self.events.append(r)

    Trainer(_spec(2, 6), checkpoint_dir=tmp_path, run_id="run-a").run()
    log = _Events()
    resumed = Trainer(_spec(2, 12, optimizer=ADAMW, optimizer_name="adamw"), [log], checkpoint_dir=tmp_path,
                      run_id="run-a", resume=True).run()
    assert resumed.status == "finished" and resumed.global_step == 12
    (changed,) = [e for e in log.events if e.kind == "optimizer_changed"]
    assert "trained with --optimizer sgd" in changed.details["warning"]
    assert "--optimizer adamw starts with fresh state at step 6" in changed.details["warning"]
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    assert ckpt.optimizer["step"].max() == 6  # AdamW's own steps since the resume: none carried from SGD


@pytest.mark.parametrize("workers, ps, cfg", [
    pytest.param(1, 1, OPT, id="1worker-1ps-momentum"),
    pytest.param(2, 3, NESTEROV_STEP, id="2workers-3ps-nesterov-step"),
    pytest.param(4, 2, WARMUP_COSINE, id="4workers-2ps-nesterov-warmup-cosine"),
])
def test_sync_ps_matches_single_process_sgd(local_ray, tmp_path, workers, ps, cfg):
    """K synchronous workers equal torch.optim.SGD over the K-averaged gradient, bit for bit: the shard
    sums a round's gradients in data-slot order, as the reference does. (Summed in arrival order, the
    4-worker run differed from the reference by 1.4e-3 in about one run in six: rounding differences
    that something in the network amplified.)"""
    steps = 12
    summary = Trainer(_spec(ps, steps, workers=workers, optimizer=cfg), checkpoint_dir=tmp_path).run()
    assert summary.status == "finished" and summary.global_step == steps
    np.testing.assert_array_equal(_final_params(tmp_path), _reference(steps, workers, cfg)[0])


@pytest.mark.parametrize("cfg", [NESTEROV_STEP, WARMUP_COSINE], ids=["step", "warmup-cosine"])
def test_shard_lr_schedule_matches_the_torch_schedule(cfg):
    """The shards' ``lr_at(step)`` is the lr torch's scheduler gives the step-th update, to float
    tolerance (the reference above is only as good as this match)."""
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr, momentum=cfg.momentum)
    schedule = _torch_schedule(sgd, cfg)
    torch_lrs = []
    for _ in range(16):
        torch_lrs.append(sgd.param_groups[0]["lr"])
        sgd.step()
        schedule.step()
    ours = [cfg.lr_at(t) for t in range(16)]
    np.testing.assert_allclose(ours, torch_lrs, rtol=1e-12)
    assert len(set(np.round(ours, 12))) >= 3  # the schedule really changes the lr


def test_reference_averages_each_workers_own_batch():
    """The K-worker reference averages K different batches (else the PS comparison proves little)."""
    one, two = _reference(3, 1, NESTEROV_STEP)[0], _reference(3, 2, NESTEROV_STEP)[0]
    assert np.abs(one - two).max() > 1e-3


# -- resume --------------------------------------------------------------------------------------

class _Starts(TrainCallback):
    def __init__(self):
        self.infos: list[RunInfo] = []

    def on_run_start(self, info):
        self.infos.append(info)


def _recording_worker(out_dir: str) -> type:
    """A Worker that writes, for its first training batch, its data slot, stream position and the
    batch's sample indices to ``out_dir/w<id>.json`` (a local class: Ray ships it by value)."""

    class RecordingWorker(Worker):
        def __init__(self, worker_id, slot, *args, **kwargs):
            super().__init__(worker_id, slot, *args, **kwargs)
            stream, plain = self.stream, self.stream.batch_indices
            path = Path(out_dir) / f"w{worker_id}.json"

            def first_batch(position):
                idx = plain(position)
                if not path.exists():
                    path.write_text(json.dumps({"slot": slot, "position": position, "indices": idx.tolist()}))
                return idx

            stream.batch_indices = first_batch

    return RecordingWorker


def _use_worker_class(mp: pytest.MonkeyPatch, cls: type) -> None:
    """Make the trainer start ``cls`` instead of :class:`Worker`: rebinds the name in every loaded
    cmdare module that imported it (not in cmdare.train.workers.worker itself, so Ray still ships the base
    class by reference)."""
    patched = [name for name, mod in list(sys.modules.items())
               if name.startswith("cmdare.") and name != Worker.__module__ and getattr(mod, "Worker", None) is Worker]
    assert patched, "no cmdare module starts Worker actors by that name any more"
    for name in patched:
        mp.setattr(sys.modules[name], "Worker", cls)


def _first_batches(out_dir: Path) -> dict[int, dict]:
    """slot -> what the worker of that slot recorded for its first batch."""
    return {r["slot"]: r for r in (json.loads(p.read_text()) for p in sorted(out_dir.glob("w*.json")))}


def _expected_batch(slot: int, workers: int, position: int, seed: int = SEED) -> list[int]:
    data = load_dataset("digits", seed=seed)
    return BatchStream(data, slot, workers, BATCH, seed).batch_indices(position).tolist()


RESUME_WORKERS = 2


@pytest.fixture(scope="module")
def sync_resume(local_ray, tmp_path_factory):
    """Sync, 2 workers, 2 shards: a straight 24-step run, and a 12-step run resumed from its step-12
    checkpoint to 24 (with workers that record their first batch after the resume)."""
    root = tmp_path_factory.mktemp("sync-resume")
    kw = dict(workers=RESUME_WORKERS, optimizer=NESTEROV_STEP)
    straight = Trainer(_spec(2, 24, checkpoint_every=12, **kw), checkpoint_dir=root / "straight").run()
    split = root / "split"
    Trainer(_spec(2, 12, **kw), checkpoint_dir=split, run_id="run-split").run()
    ckpt_step = load_checkpoint(latest_checkpoint(split)).step
    firsts = root / "first-batches"
    firsts.mkdir()
    starts = _Starts()
    with pytest.MonkeyPatch.context() as mp:
        _use_worker_class(mp, _recording_worker(str(firsts)))
        resumed = Trainer(_spec(2, 24, checkpoint_every=12, **kw), [starts], checkpoint_dir=split,
                          run_id="run-split", resume=True).run()
    return dict(straight=straight, resumed=resumed, starts=starts, ckpt_step=ckpt_step,
                straight_params=_final_params(root / "straight"), resumed_params=_final_params(split),
                firsts=_first_batches(firsts))


def test_sync_resume_restarts_each_worker_at_the_checkpoint_step(sync_resume):
    """In synchronous training every worker consumes one batch per global step, so after resuming at
    step k each worker's first batch is batch k of its own slot's stream."""
    k = sync_resume["ckpt_step"]
    assert k == 12 and sync_resume["starts"].infos[0].resumed_from_step == k
    firsts = sync_resume["firsts"]
    assert sorted(firsts) == list(range(RESUME_WORKERS))
    for slot, rec in firsts.items():
        assert (rec["position"], rec["indices"]) == (k, _expected_batch(slot, RESUME_WORKERS, k)), (
            f"slot {slot} resumed at data position {rec['position']}, not at the checkpoint's step {k}")


def test_resume_continues_from_checkpoint_exactly(sync_resume):
    """Sync with 2 workers (a 2-gradient sum is order-independent, so runs are deterministic): the
    resumed run ends bit-identical to the straight run."""
    assert sync_resume["straight"].global_step == sync_resume["resumed"].global_step == 24
    np.testing.assert_array_equal(sync_resume["resumed_params"], sync_resume["straight_params"])


def test_async_resume_restarts_every_worker_where_the_checkpoint_says(local_ray, tmp_path):
    """Asynchronous: a checkpoint records only the global step k (no per-worker data position), and
    each of the K workers resumes its slot's stream at position k // K (``Worker``: "each worker has
    consumed about step / num_slots batches"). The first batch each resumed worker trains on is the
    batch at that position of its own slot."""
    workers = 3
    spec = dict(workers=workers, sync=False, chunk_steps=4)
    Trainer(_spec(1, 11, **spec), checkpoint_dir=tmp_path / "ck", run_id="run-a").run()
    path = latest_checkpoint(tmp_path / "ck")
    k = load_checkpoint(path).step
    assert k == 11  # the final checkpoint, at the target step
    firsts = tmp_path / "first-batches"
    firsts.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        _use_worker_class(mp, _recording_worker(str(firsts)))
        summary = Trainer(_spec(1, 17, **spec), checkpoint_dir=tmp_path / "ck", run_id="run-a",
                          resume_from=path).run()
    assert summary.status == "finished" and summary.global_step == 17
    got = _first_batches(firsts)
    assert sorted(got) == list(range(workers))
    for slot, rec in got.items():
        assert rec["position"] == k // workers
        assert rec["indices"] == _expected_batch(slot, workers, k // workers)
