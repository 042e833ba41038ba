"""An all-reduce member: the whole model and optimizer, gradients averaged over the elastic group each step.

A member is a plain class; a run makes it a Ray actor. The driver tells it the group it is in
(:meth:`Replica.form`: epoch, rank, size); :meth:`Replica.heal` copies a peer's whole training state to every
member (parameters, buffers, optimizer state, the step and the data position), which is how a newcomer joins and
how survivors agree after a loss. A lost peer never hangs a member: the step in flight is dropped (its
optimizer step not taken, its data position restored) and :meth:`Replica.run_steps` reports the loss.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cmdare.collective import ElasticGroup, GradientBuckets, PeerLost
from cmdare.datasets import GroupBatches
from cmdare.ps.layout import flat_model_params, load_model_flat
from cmdare.ps.torch_optimizer import build_optimizer
from cmdare.tasks.seeding import seed_worker
from cmdare.train.allreduce.optimizer_state import load_optimizer_arrays, optimizer_arrays
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.precision import forward_precision, loss_scale_for
from cmdare.train.workers.worker import pick_device, ray_node_id

__all__ = ["MemberChunk", "Replica"]


@dataclass(frozen=True)
class MemberChunk:
    """What a member reports after a chunk of steps."""

    steps: int  # steps completed in the group
    duration_s: float
    loss: float  # mean training loss of the completed steps (nan: none)
    step: int  # the global step of the state held (steps applied since the start)
    lost: str | None = None  # a peer was lost in the step after `step`: that step was dropped
    notice: dict[str, Any] | None = None  # the member's server got a preemption notice (provider, deadline)
    overflow_skips: int = 0  # amp-fp16: batches whose averaged gradient overflowed in this chunk (no step taken)
    loss_scale: float | None = None  # amp-fp16: the group's loss scale at the chunk's end
    diverged_at: int | None = None  # amp-fp16: the gradient overflowed at the smallest scale, at this step


class Replica:
    """One member of an all-reduce run.

    Args:
        spec: the run's spec (model, data, batch size, seed, optimizer hyper-parameters).
        rendezvous: the driver's :class:`~cmdare.collective.Rendezvous` address.
        optimizer: ``sgd``, ``adamw`` or a ``torch.optim`` class by import path.
        member_seed: the seed of this member's own random streams (dropout masks).
        deadline_s: the most a collective may take before its peers count as lost.
        bind_host: the address this member's collective connections listen on (default: its Ray node's address,
            127.0.0.1 outside Ray).
        lr_scale: the learning rate's factor (the fleet's ``--lr-policy`` on a size change; :meth:`form` sets it).
        global_batch: keep the global batch at this many samples whatever the group's size (each member's batch
            is its share); None: each member trains ``spec.batch_size`` samples a step, so the global batch
            follows the size.
    """

    def __init__(self, spec: TrainSpec, rendezvous: tuple[str, int], optimizer: str = "sgd",
                 member_seed: int = 0, threads: int | None = None, deadline_s: float = 5.0,
                 bind_host: str | None = None, lr_scale: float = 1.0, global_batch: int | None = None,
                 notice: tuple[str, str] | None = None):
        self.init_at = time.time()  # torch and cmdare imported (a warm spare's phases of start)
        if threads:
            torch.set_num_threads(threads)
        self.spec, self.lr_scale = spec, lr_scale
        self.device = pick_device()
        torch.manual_seed(spec.seed)  # every member builds the same initial model
        self.task = spec.task()
        self.model = self.task.build().to(self.device)
        self.forward_precision = forward_precision(spec.precision, self.device)  # fp32, or amp's autocast
        # amp-fp16: the loss is scaled before backward and the group's averaged gradient checked after it. A peer's
        # overflow makes the average non-finite on every member, so every member skips the same steps, halving
        # the same scale: the group's scale is one, and a newcomer takes it with the rest of the state (heal)
        self.loss_scale = loss_scale_for(spec.precision)
        self.optimizer = build_optimizer(optimizer, self.model.parameters(), spec.optimizer)
        self.group = ElasticGroup(rendezvous, bind_host or _node_address(), deadline_s)
        self.buckets = GradientBuckets(list(self.model.parameters()), self.group)
        self.batches = GroupBatches(self.task.train, spec.batch_size, spec.seed, global_batch=global_batch)
        seed_worker(spec.seed, member_seed)
        self.step = 0
        from cmdare.cloud.notices import server_watchers

        # what tells the member its server goes away (``notice``: a metadata endpoint's URL and provider; a
        # cloud node's own; Ray's drain of its node): seen before a step, said when the chunk ends
        self.watchers = server_watchers(notice, ray_node_id())
        for watcher in self.watchers:
            watcher.start()
        self.noticed: dict[str, Any] | None = None
        self.ready_at = time.time()  # the process is up and the model built

    # -- the group ---------------------------------------------------------------------------------
    def form(self, epoch: int, rank: int, size: int, lr_scale: float | None = None) -> bool:
        """Join the group of ``epoch`` as member ``rank`` of ``size`` (``lr_scale``: the learning rate's factor at
        that size, by the run's policy); False if a peer did not come."""
        if lr_scale is not None:
            self.lr_scale = lr_scale
        try:
            self.group.form(epoch, rank, size)
        except PeerLost:
            return False
        self.batches.regroup(rank, size)
        if self.batches.global_batch is not None:  # its share of the global batch's mean gradient
            self.buckets.weight = self.batches.piece()[1] / self.batches.global_batch
        return True

    def heal(self, root: int) -> bool:
        """Every member takes member ``root``'s training state (parameters, buffers, optimizer state, step, data
        position); False if a peer was lost meanwhile."""
        if self.group.size == 1:
            return True
        payload = self._state_bytes() if self.group.rank == root else b""
        length = torch.tensor([len(payload)], dtype=torch.int64)
        try:
            self.group.broadcast(length, root)
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
                torch.empty(int(length.item()), dtype=torch.uint8)
            self.group.broadcast(buf, root)
        except PeerLost:
            return False
        if self.group.rank != root:
            self._load_state(buf.numpy().tobytes())
        return True

    def _state_bytes(self) -> bytes:
        out = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                    "where": self.batches.where,
                    "loss_scale": self.loss_scale.state_dict() if self.loss_scale is not None else None}, out)
        return out.getvalue()

    def _load_state(self, data: bytes) -> None:
        state = torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.batches.seek(*state["where"])
        if self.loss_scale is not None and state.get("loss_scale") is not None:
            self.loss_scale.load_state_dict(state["loss_scale"])

    # -- training -------------------------------------------------------------------------------
    def run_steps(self, max_steps: int, stop_at: int | None = None) -> MemberChunk:
        """Train up to ``max_steps`` steps in the group (stopping at global step ``stop_at``); a lost peer ends the
        chunk with the step in flight dropped."""
        self.model.train()
        t_start = time.perf_counter()
        steps, loss_sum, lost, diverged_at = 0, 0.0, None, None
        skipped_before = self.loss_scale.skipped if self.loss_scale is not None else 0
        while steps < max_steps and (stop_at is None or self.step < stop_at):
            self._watch()
            where = self.batches.where
            buffers = [b.clone() for b in self.model.buffers()] if self.group.size > 1 else None
            self.optimizer.zero_grad()
            with self.forward_precision():  # the forward pass and the loss; backward follows their dtypes
                loss = self.task.step_loss(self.model, self.batches, self.device, self.step)
            self.buckets.arm()
            self.task.backward(self.model, loss if self.loss_scale is None else self.loss_scale.scaled(loss), self.step)
            try:
                self.buckets.finish()
            except PeerLost as err:
                self.batches.seek(*where)  # the step is dropped: its data is taken again, its statistics undone
                for b, saved in zip(self.model.buffers(), buffers or (), strict=False):
                    b.copy_(saved)
                lost = err.detail
                break
            if self.loss_scale is not None and not self._unscale():
                if self.loss_scale.exhausted:  # not finite even unscaled: diverged, as a non-finite loss
                    diverged_at, loss_sum = self.step, float("nan")
                    break
                continue  # an overflow on some member: every member skips this step, the scale halved
            if self.spec.clip_grad_norm is not None:  # the group's averaged gradient: every member clips alike
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.clip_grad_norm)
            lr = self.spec.optimizer.lr_at(self.step, self.lr_scale)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.step += 1
            steps += 1
            loss_sum += float(loss.detach())
        self._watch()
        return MemberChunk(steps, time.perf_counter() - t_start, loss_sum / steps if steps else float("nan"),
                           self.step, lost, self.noticed, diverged_at=diverged_at,
                           **(self.loss_scale.chunk_report(skipped_before) if self.loss_scale is not None else {}))

    def _unscale(self) -> bool:
        """amp-fp16: divide the group's averaged gradient by the loss scale (``torch.amp.GradScaler.unscale_``'s
        arithmetic) and take the step (True), or on an overflow leave it and skip (False, the scale halved)."""
        assert self.loss_scale is not None
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        inverse = 1.0 / self.loss_scale.scale
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())  # one read back from a GPU
        if not self.loss_scale.update(finite):
            return False
        torch._foreach_mul_(grads, inverse)
        return True

    def _watch(self) -> None:
        """Note a preemption notice a watcher saw. The member trains on to the end of its chunk: every member of
        the round stops at the same step, where the group is re-formed without it (nothing is lost)."""
        if self.noticed is None:
            n = next((w.notice for w in self.watchers if w.notice is not None), None)
            if n is not None:
                self.noticed = {"provider": n.provider, "detected_at": n.detected_at, "deadline": n.deadline}

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, path: str) -> int:
        """Write the whole training state to ``path`` (written beside it, then renamed); returns its step."""
        import os

        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(self._state_bytes())
        os.replace(tmp, path)
        return self.step

    def load(self, path: str) -> int:
        """Take the training state ``path`` holds (from :meth:`save`); returns its step."""
        with open(path, "rb") as f:
            self._load_state(f.read())
        return self.step

    def checkpoint(self) -> dict[str, Any]:
        """The training state as a checkpoint holds it (:class:`~cmdare.train.duties.checkpoint.Checkpoint`'s
        fields): step, flat parameters, SGD momentum, buffers, the optimizer's other state, and the data position
        (for its metadata)."""
        params = list(self.model.parameters())
        momentum, others = optimizer_arrays(self.optimizer, params)
        return {"step": self.step, "params": self.params(), "momentum": momentum,
                "buffers": {k: v.detach().cpu().numpy().copy() for k, v in self.model.named_buffers()},
                "optimizer": others, "where": list(self.batches.where)}

    def restore(self, state: dict[str, Any]) -> int:
        """Take a checkpoint's state (:meth:`checkpoint`'s keys; of either topology: a parameter server's holds no
        optimizer state but SGD's momentum and no data position, so the group starts the epoch over); returns its
        step."""
        buffers, where = state.get("buffers") or {}, state.get("where")
        load_model_flat(self.model.parameters(), torch.from_numpy(np.array(state["params"], dtype=np.float32)))
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                if name in buffers:
                    b.copy_(torch.from_numpy(np.array(buffers[name])).to(b))
        load_optimizer_arrays(self.optimizer, list(self.model.parameters()), state["momentum"],
                              state.get("optimizer") or {})
        self.step = int(state["step"])
        self.batches.seek(*(tuple(where) if where is not None else (0, 0)))
        return self.step

    def evaluate(self) -> tuple[Any, int]:
        """The test loss and metrics of the held model (the group's: every member holds the same), and its step."""
        self.model.eval()
        try:
            return self.task.evaluate(self.model, self.device, None), self.step
        finally:
            self.model.train()

    # -- reading the state -----------------------------------------------------------------------
    def params(self) -> np.ndarray:
        """The parameters, flattened in ``model.parameters()`` order."""
        return flat_model_params(list(self.model.parameters()))

    def position(self) -> tuple[int, int, int]:
        """``(step, epoch, cursor)``: the state's global step and the group's data position."""
        return (self.step, *self.batches.where)

    def ping(self) -> float:
        """When the member was ready (its process up, the model built), as ``time.time()``."""
        return self.ready_at

    def standby_ready(self) -> tuple[str | None, float, dict[str, float]]:
        """A warm spare's :meth:`ready`, and when its ``__init__`` began."""
        return ray_node_id(), self.ready_at, {"init_at": self.init_at}

    def adopt(self, worker_id: int) -> dict[str, Any]:
        """A warm spare becomes member ``worker_id`` (its own random streams); its state comes with the group's
        heal. Returns when it was up and the times (as a PS run's standby worker does)."""
        t0 = time.perf_counter()
        seed_worker(self.spec.seed, worker_id)
        return {"node_id": ray_node_id(), "up_at": self.ready_at, "adopt_init_s": time.perf_counter() - t0,
                "first_pull_s": 0.0}

    def ready(self) -> tuple[str | None, float]:
        """Its Ray node (hex; None outside Ray) and when it was ready: what a run's executor records."""
        return ray_node_id(), self.ready_at

    def leave(self) -> None:
        """Stop watching for notices and leave the group (its peers' collectives fail at once, not at the
        deadline)."""
        for watcher in self.watchers:
            watcher.stop()
        self.group.abandon()


def _node_address() -> str:
    """This process's Ray node address (what its peers on other nodes reach it at); 127.0.0.1 outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - outside Ray
        pass
    return "127.0.0.1"
