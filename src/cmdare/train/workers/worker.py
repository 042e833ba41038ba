"""The worker: pulls parameters, computes a gradient on its data shard, pushes, repeats.

A worker is a plain class; the coordinator turns it into a Ray actor. It uses its server's GPU
when Ray gave it one, the CPU otherwise. It runs steps in chunks (``run_steps``) so that the
coordinator regains control often: to record progress, checkpoint, move blocks or notice a loss.
"""

from __future__ import annotations

import logging
import time
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cmdare.ps.channel import ChannelClient, ChannelClosed, SharedHostMemory, channels_enabled, receive_all
from cmdare.ps.layout import FlatLayout, load_model_flat
from cmdare.ps.placement import Placement
from cmdare.ps.shard_state import complement
from cmdare.ps.tcp_channel import TcpChannelClient
from cmdare.tasks import Evaluation
from cmdare.tasks.seeding import seed_worker
from cmdare.train.ps.shard_channels import open_channels
from cmdare.train.spec import TrainSpec
from cmdare.train.workers.chunk_result import ChunkResult
from cmdare.train.workers.overlap import GradientPieces, pieced_shard
from cmdare.train.workers.precision import forward_precision, loss_scale_for

log = logging.getLogger(__name__)


def pick_device() -> torch.device:
    """The GPU Ray assigned to this process, else the CPU."""
    try:
        import ray

        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - outside Ray
        gpu_ids = []
    if gpu_ids and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


#: With several shards, per-shard waits are timed (a ``ray.wait`` per reply, ~0.7 ms a step for two
#: shards) on every 4th step and scaled to all pushes; with one shard every step is timed for free.
WAIT_SAMPLE_EVERY = 4


def _gather_timed(refs: list[Any], live: list[int], wait_s: list[float], t_sent: float) -> list[Any]:
    """``ray.get(refs)``, adding each shard's send-to-reply time to ``wait_s[shard]``."""
    import ray

    if len(refs) == 1:
        replies = ray.get(refs)
        wait_s[live[0]] += time.perf_counter() - t_sent
        return replies
    shard_of = dict(zip(refs, live, strict=True))
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        now = time.perf_counter()
        for ref in ready:
            wait_s[shard_of[ref]] += now - t_sent
    return ray.get(refs)


class Worker:
    """One training worker (a Ray actor in a run; a plain object in tests)."""

    def __init__(self, worker_id: int, slot: int, num_slots: int, spec: TrainSpec,
                 shards: Sequence[Any], placement: Placement, threads: int | None = None,
                 start_step: int = 0, notice: tuple[str, str] | None = None, stretch: float = 1.0):
        self._build(spec, threads)
        self._join(worker_id, slot, num_slots, shards, placement, start_step, notice, stretch)

    def _build(self, spec: TrainSpec, threads: int | None) -> None:
        """What any worker of the run needs: its device, the task's data and the model (a warm spare's part)."""
        if threads:
            torch.set_num_threads(threads)
        self.spec = spec
        self.device = pick_device()
        torch.manual_seed(spec.seed)  # every worker builds the same initial model
        self.task = spec.task()
        self.model = self.task.build().to(self.device)
        self.forward_precision = forward_precision(spec.precision, self.device)
        self.loss_scale = loss_scale_for(spec.precision)  # amp-fp16: pushes after its overflow check, never in pieces

    def _join(self, worker_id: int, slot: int, num_slots: int, shards: Sequence[Any], placement: Placement,
              start_step: int, notice: tuple[str, str] | None, stretch: float) -> None:
        """Become member ``worker_id`` of data slot ``slot``: its batch stream, the shards, the notice watchers."""
        spec = self.spec
        self.worker_id, self.slot, self.num_slots = worker_id, slot, num_slots
        seed_worker(spec.seed, slot)  # then draws its dropout masks from a stream of its own (seed, data slot)
        # Resume where the data stream was: in synchronous mode every worker consumed one batch per global
        # step; asynchronously the workers share the steps, about step / num_slots batches each.
        self.stream = self.task.stream(slot, num_slots, spec.batch_size, spec.seed,
                                       start_batch=start_step if spec.sync else start_step // num_slots)
        self.node_id = ray_node_id()  # None outside Ray (a plain object in tests)
        self.channels: dict[int, ChannelClient | TcpChannelClient] = {}  # shard index -> its channel
        self.same_node: set[int] = set()  # the shards of self.channels on this worker's node
        self.pieces: GradientPieces | None = None  # gradient pieces announced during backward
        self.ray_pieces: list[Any] = []  # refs of the pieces sent through Ray this step
        self._bind(placement, shards)
        self.step = -1  # global step of the parameters held; -1 before the first pull
        self.pull_first = False  # pull again before the next step (parameters pulled before the worker joined)
        self._calibrated: tuple[int | None, int] | None = None  # the parameters the statistics were recomputed for
        # emulating a slower GPU type on this machine: every step takes `stretch` times as long (>= 1)
        self.stretch = max(1.0, float(stretch))
        self.started_at = time.time()  # the process is up and the model built (a server's start-up ends)
        from cmdare.cloud.notices import server_watchers

        self.watchers = server_watchers(notice, self.node_id)
        self.risk_told = False  # a rebalance recommendation reported (once)
        for watcher in self.watchers:
            watcher.start()

    def _new_risk(self) -> dict[str, Any] | None:
        """A rebalance recommendation a watcher saw and this worker has not reported yet (then reported)."""
        if self.risk_told:
            return None
        risk = next((r for r in (getattr(w, "risk", None) for w in self.watchers) if r is not None), None)
        if risk is None:
            return None
        self.risk_told = True
        return {"provider": risk.provider, "action": risk.action, "detected_at": risk.detected_at}

    # -- parameters ------------------------------------------------------------------------
    def set_layout(self, placement: Placement, shards: Sequence[Any]) -> int:
        """Adopt a new placement (after a migration or a shard change) and pull everything."""
        self._bind(placement, shards)
        return self.pull()

    def _bind(self, placement: Placement, shards: Sequence[Any]) -> None:
        """Lay the model out for ``placement`` and open a channel to every shard: on this worker's node the
        shared-memory one (its host buffers then live in shared memory), on another node the TCP one; a shard
        whose channel cannot be opened is reached through Ray, with the reason logged."""

        self.shards = list(shards)
        self._close_channels()
        if self.pieces is not None:
            self.pieces.remove()
            self.pieces = None
        params = list(self.model.parameters())
        memory = SharedHostMemory(sum(p.numel() for p in params)) if self.node_id and channels_enabled() else None
        self.layout = FlatLayout(params, placement, self.device,
                                 host=(memory.params, memory.grads) if memory is not None else None)
        live = self._live_shards()
        self.channels, self.same_node = open_channels(self.shards, live, self.layout, self.node_id, memory)
        spans = self.layout.param_spans()
        pieced = [k for k in live if pieced_shard(self.spec, k in self.same_node, self.layout.shard_ranges[k])]
        if pieced and spans is not None and self.loss_scale is None and self.spec.clip_grad_norm is None:
            self.pieces = GradientPieces(params, spans, self.layout.shard_ranges, pieced, self._announce_piece)

    def _announce_piece(self, shard: int, lo: int, hi: int) -> None:
        """From backward: elements ``[lo, hi)`` of ``shard``'s range are final (brought to host memory
        first); a channel's shard reads them in place, another node's gets a copy through Ray (staged there
        until the push)."""
        a, b = self.layout.shard_ranges[shard]
        self.layout.grads_range_to_host(a + lo, a + hi)
        if shard in self.channels:
            self.channels[shard].send_piece(lo, hi - lo, self.step, self.slot)
        else:
            self.ray_pieces.append(self.shards[shard].push_piece.remote(
                self.worker_id, lo, self.layout.host_grads_np[a + lo:a + hi], b - a, self.step, self.slot))

    def _push_ref(self, k: int, sent_at: float):
        """Push shard ``k``'s gradient through Ray: whole, or what its pieces left (``push_rest``)."""
        sent = self.pieces.sent_ranges(k) if self.pieces is not None else []
        if not sent:
            return self.shards[k].push_pull.remote(self.layout.shard_grad(k), self.step, sent_at, self.slot)
        grad = self.layout.shard_grad(k)
        rest = complement(sent, grad.size)
        values = np.concatenate([grad[lo:hi] for lo, hi in rest]) if rest else np.zeros(0, np.float32)
        return self.shards[k].push_rest.remote(self.worker_id, len(sent), rest, values, grad.size, self.step,
                                               sent_at, self.slot)

    def _close_channels(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels, self.same_node = {}, set()

    def _channel_lost(self, err: ChannelClosed) -> None:
        """A channel closed under a push: raise Ray's error for the shard that died (the coordinator maps
        it to a shard loss), or ``err`` when every shard still answers."""
        import ray

        ray.get([self.shards[k].ping.remote() for k in self.channels])
        raise err

    def pull(self) -> int:
        """Fetch every shard's parameters; returns the global step they correspond to."""
        import ray

        live = self._live_shards()
        replies = ray.get([self.shards[k].pull.remote() for k in live])
        steps = []
        for k, (values, step) in zip(live, replies, strict=True):
            self.layout.set_shard_params(k, values)
            steps.append(step)
        self.layout.host_to_params()
        self.step = max(steps, default=0)
        return self.step

    def data_paths(self) -> dict[str, list[int]]:
        """Which shards (placement indices) this worker reaches by the same-node channel, by the TCP channel (on
        another node) and through Ray."""
        live = self._live_shards()
        return {"channel": [k for k in live if k in self.same_node],
                "tcp": [k for k in live if k in self.channels and k not in self.same_node],
                "ray": [k for k in live if k not in self.channels]}

    def _live_shards(self) -> list[int]:
        return [k for k, (a, b) in enumerate(self.layout.shard_ranges) if b > a]

    # -- training --------------------------------------------------------------------------
    def run_steps(self, max_steps: int, max_s: float, step_s: float = 0.0,
                  stop_at: int | None = None) -> ChunkResult:
        """Train up to ``max_steps`` steps or ``max_s`` seconds; stop early at the fence ``stop_at`` (the shards
        refuse pushes past it; a worker that knows the shards are there does not start another step).

        ``step_s`` > 0 (emulating a slower GPU type): every step lasts at least that long; else, with a
        ``stretch`` above 1, each step lasts ``stretch`` times its own time.
        """
        import ray

        if self.step < 0 or self.pull_first:
            self.pull()
            self.pull_first = False
        self.model.train()
        self._calibrated = None  # training moves the statistics on
        live = self._live_shards()
        local = {k: self.channels[k] for k in live if k in self.channels}
        remote = [k for k in live if k not in local]
        t_start = time.perf_counter()
        compute_s = comm_s = loss_sum = 0.0
        steps, staleness, done = 0, [], False
        diverged_at: int | None = None
        notice = None
        wait_s = [0.0] * len(self.shards)
        sampled = 0  # steps whose per-shard waits were timed
        skipped_before = self.loss_scale.skipped if self.loss_scale is not None else 0
        while steps < max_steps and time.perf_counter() - t_start < max_s:
            if stop_at is not None and self.step >= stop_at:
                break
            n = next((w.notice for w in self.watchers if w.notice is not None), None)
            if n is not None:
                notice = {"provider": n.provider, "detected_at": n.detected_at, "deadline": n.deadline}
                break
            t0 = time.perf_counter()
            self.layout.zero_grads()
            with self.forward_precision():  # a mistake in the user's code: one line
                loss = self.task.step_loss(self.model, self.stream, self.device, self.step)
            if not torch.isfinite(loss):  # diverged: its gradient would make every shard's parameters non-finite
                diverged_at, loss_sum = self.step, float("nan")
                break
            if self.pieces is not None:
                self.ray_pieces = []
                self.pieces.arm()
            self.task.backward(self.model, loss if self.loss_scale is None else self.loss_scale.scaled(loss), self.step)
            announced = self.pieces.finish() if self.pieces is not None else {}
            if self.spec.clip_grad_norm is not None:  # its own gradient, whole (no piece left before backward ended)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.clip_grad_norm)
            self.layout.grads_to_host()
            if self.loss_scale is not None and not self.loss_scale.unscale(self.layout.host_grads_np):
                if self.loss_scale.exhausted:  # not finite even unscaled: diverged, as a non-finite loss
                    diverged_at, loss_sum = self.step, float("nan")
                    break
                continue  # an overflow: nothing pushed, the scale halved, the next batch
            t1, sent_at = time.perf_counter(), time.time()
            timed = len(live) == 1 or steps % WAIT_SAMPLE_EVERY == 0
            try:
                for k, channel in local.items():  # the shard reads the gradient where backward left it
                    channel.send(self.step, sent_at, self.slot, announced.get(k, 0))
                refs = [self._push_ref(k, sent_at) for k in remote]
                replies = receive_all(local, t1, wait_s if timed else None) if local else {}
            except ChannelClosed as err:
                self._channel_lost(err)
            if self.ray_pieces:  # staged by their shards long ago; a failure (a dead shard) is raised here
                pieces, self.ray_pieces = self.ray_pieces, []
                ray.get(pieces)
            if refs:
                remote_replies = _gather_timed(refs, remote, wait_s, t1) if timed else ray.get(refs)
                for k, (values, step_k, applied_k) in zip(remote, remote_replies, strict=True):
                    self.layout.set_shard_params(k, values)  # a channel's shard wrote its values in place
                    replies[k] = (step_k, applied_k)
            sampled += timed
            self.layout.host_to_params()
            comm_s += time.perf_counter() - t1
            compute_s += t1 - t0
            applied = all(r[1] for r in replies.values())
            step_after = max(r[0] for r in replies.values())
            if not applied:
                done = True
                self.step = step_after
                break
            staleness.append(max(0, replies[live[0]][0] - 1 - self.step))
            self.step = step_after
            loss_sum += float(loss.detach())
            steps += 1
            if step_s > 0:
                time.sleep(max(0.0, step_s - (time.perf_counter() - t0)))
            elif self.stretch > 1.0:
                time.sleep((self.stretch - 1.0) * (time.perf_counter() - t0))
        scale = (steps + done) / sampled if sampled else 0.0  # estimate over every push from the sample
        return ChunkResult(self.worker_id, steps, time.perf_counter() - t_start,
                           loss_sum / steps if steps else float("nan"), compute_s, comm_s, self.step,
                           tuple(staleness), done, notice, tuple(w * scale for w in wait_s),
                           params_finite=self.layout.params_finite(), diverged_at=diverged_at,
                           at_risk=self._new_risk(),
                           **(self.loss_scale.chunk_report(skipped_before) if self.loss_scale else {}))

    # -- chief duties ----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, params: np.ndarray | None = None, step: int | None = None,
                 max_samples: int | None = None) -> tuple[Evaluation, int]:
        """The test loss and metrics (accuracy on a built-in dataset) of ``params`` (the flat parameters of
        ``step``, in model order; default: the parameters this worker holds), and the step. Given parameters
        replace the held ones, as a pull would (they are at least as new), and the batch-norm statistics are
        recomputed for them (:meth:`statistics`)."""
        if params is not None:
            self._calibrate(params, step)
        self.model.eval()
        result = self.task.evaluate(self.model, self.device, max_samples)
        self.model.train()
        return result, self.step

    def statistics(self, params: np.ndarray, step: int) -> dict[str, np.ndarray]:
        """The buffers of the model with ``params`` (the flat parameters of ``step``), batch-norm statistics
        recomputed for them from the run's calibration batches (:mod:`cmdare.tasks.statistics`): what a
        checkpoint of that step holds, whichever worker is chief and however long it has trained."""
        self._calibrate(params, step)
        return self.buffers()

    def _calibrate(self, params: np.ndarray, step: int | None) -> None:
        """Hold ``params`` (as a pull would) and recompute the batch-norm statistics for them, once per set of
        parameters (an evaluation and a checkpoint of one step share it); ``bn_samples`` 0: keep this worker's."""
        flat = np.ascontiguousarray(params, np.float32)
        key = (step, zlib.adler32(memoryview(flat).cast("B")))
        if key == self._calibrated:
            return
        with warnings.catch_warnings():  # Ray's zero-copy arrays are read-only; they are only read here
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            values = torch.from_numpy(flat)
        load_model_flat(self.model.parameters(), values)  # in place: the layout's views of the parameters stay
        self.step = max(self.step, int(step)) if step is not None else self.step
        if self.spec.bn_samples > 0:
            self.task.recompute_statistics(self.model, self.device, self.spec.batch_size, self.spec.seed,
                                           self.spec.bn_samples)
        self._calibrated = key

    def buffers(self) -> dict[str, np.ndarray]:
        """Non-trainable state (batch-norm running statistics) of this worker's model."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.named_buffers()}

    def load_buffers(self, buffers: dict[str, np.ndarray] | None) -> None:
        """Take these batch-norm statistics (None: a fresh model's)."""
        self._calibrated = None
        if buffers is None:
            for module in self.model.modules():
                if hasattr(module, "reset_running_stats"):
                    module.reset_running_stats()
            return
        own = dict(self.model.named_buffers())
        with torch.no_grad():
            for k, v in buffers.items():
                if k in own:
                    own[k].copy_(torch.from_numpy(np.asarray(v)))

    def ping(self) -> int:
        return self.step

    def ready(self) -> tuple[str | None, float]:
        """The Ray node this worker runs on and when its process was up (once the actor exists)."""
        return self.node_id, self.started_at

    def device_info(self) -> dict[str, Any]:
        """Where this worker trains: its torch device and the GPU ids Ray assigned it."""
        import ray

        return {"device": str(self.device), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def leave(self) -> None:
        """Stop watching for notices and close the channels before the coordinator releases this worker."""
        for watcher in self.watchers:
            watcher.stop()
        self._close_channels()


def ray_node_id() -> str | None:
    """The Ray node this process runs on (hex), or None outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - outside Ray
        return None

