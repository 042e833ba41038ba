"""The parameter shards of a run as one group: start, restore from a checkpoint, migrate, stats.

Each shard is an actor on its own PS server (on-demand, or transient with ``--ps-transient``). The
group keeps the shards, their servers and the placement (which blocks live on which shard) consistent
through shard losses, evacuations and PSLD moves. A spare (:meth:`ShardGroup.start_spare`) is a shard
actor started ahead, empty, that the next added shard takes (a replacement PS, started on a notice).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.cloud.servers import ServerSpec
from cmdare.events import ShardReport
from cmdare.ps.blocks import ParamInfo
from cmdare.ps.layout import shard_arrays_from_model_flat, shard_optimizer_state
from cmdare.ps.migration import MigrationResult
from cmdare.ps.migration import execute as execute_decisions
from cmdare.ps.placement import Placement, get_placement
from cmdare.ps.psld.decisions import Decision
from cmdare.ps.psld.load import ShardLoad, block_loads
from cmdare.ps.shard import AsyncShardActor, BlockData, SyncShardActor
from cmdare.ps.shard_optimizer import shard_optimizer
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.spec import TrainSpec

__all__ = ["SHARD_ANSWER_S", "ShardGroup"]

#: How long a shard may take to answer a ping or a stats call before it counts as frozen (ended, and handled as
#: a lost shard). A shard answers between pushes, in milliseconds; a stopped or hung process never.
SHARD_ANSWER_S = 10.0


class ShardGroup:
    """The run's shards, their servers and placement."""

    def __init__(self, spec: TrainSpec, provider: ServerProvider, ps_spec: ServerSpec, infos: list[ParamInfo],
                 emitter: RunEmitter, detached: DetachedCalls):
        self.spec, self.provider, self.ps_spec, self.infos = spec, provider, ps_spec, infos
        self.emitter, self.detached = emitter, detached
        self.shards: list[Any] = []
        self.servers: list[Server] = []
        self.placement: Placement | None = None
        self.lr_scale = 1.0
        self.num_workers = spec.workers
        self.size_epoch = 0  # numbers round-size changes, so shards apply them in the order made
        self.waits: list[float] = []  # per shard: workers' send-to-reply seconds since the last stats
        self.spares: list[Server] = []  # started shard actors not yet holding blocks (ready ones first)
        self.version = 0  # bumped whenever a shard actor or the placement changes: workers then take the layout
        self.unresponsive: set[int] = set()  # shards ended for not answering, until a restore replaces them

    def new_shard(self, k: int, server: Server | None = None) -> Any:
        """Shard actor ``k`` (empty): a ready spare's, else one started on a new PS server."""
        if server is None and self.spares and self.spares[0].joined_at is not None:
            server = self.spares.pop(0)
            self.servers.append(server)
            return server.actor
        server = server or self.provider.request(self.ps_spec)
        self.servers.append(server)
        self.emitter.server_event("server_requested", server)
        return self._start_actor(k, server)

    def start_spare(self) -> Any:
        """Start an empty shard actor on a new PS server, ahead of need; returns its ``ping`` reference
        (ready once the actor is up: then call :meth:`spare_ready`)."""
        server = self.provider.request(self.ps_spec)
        self.spares.append(server)
        self.emitter.server_event("server_requested", server)
        return self._start_actor(len(self.shards), server).ping.remote()

    def spare_ready(self, server: Server) -> None:
        """A spare's actor answered: it joins the run (bills, and is taken by the next added shard)."""
        server.joined_at = time.time()
        self.emitter.server_event("server_joined", server)
        self.spares.sort(key=lambda srv: srv.joined_at is None)

    def replace_shard(self, k: int, spare: Server) -> None:
        """Shard ``k`` is now the (ready) spare ``spare``'s actor, which takes over its blocks."""
        old = self.shards[k]
        self.shards[k] = spare.actor
        self.version += 1
        self.servers = [spare if srv.actor is old else srv for srv in self.servers]

    def end_server(self, server: Server, reason: str) -> None:
        """End one PS server (its actor is stopped by the caller)."""
        self._end(server, reason)

    def _start_actor(self, k: int, server: Server) -> Any:
        import ray

        spec = self.spec
        opts = {"num_cpus": spec.cpus_per_shard, "max_restarts": 0, **self.provider.actor_options(server)}
        if spec.sync:
            actor = ray.remote(SyncShardActor).options(**opts).remote(
                k, spec.shard_optimizer(), spec.steps, max(1, self.num_workers), spec.optimizer_name)
        else:
            actor = ray.remote(AsyncShardActor).options(**opts).remote(k, spec.shard_optimizer(), spec.steps,
                                                                      spec.optimizer_name)
        server.actor = actor
        if self.lr_scale != 1.0:
            self.detached.add(actor.set_lr_scale.remote(self.lr_scale))
        if spec.lr_policy == "staleness":
            self.detached.add(actor.set_staleness_damping.remote(True))
        if spec.ps_bandwidth:
            self.detached.add(actor.set_link.remote(spec.ps_link_bytes_per_s()))
        return actor

    def _load(self, state: Checkpoint) -> None:
        """Load every shard with its blocks of ``state`` (parameters, optimizer state, step)."""
        import ray

        assert self.placement is not None
        values = shard_arrays_from_model_flat(state.params, self.infos, self.placement)
        moms = shard_arrays_from_model_flat(state.momentum, self.infos, self.placement)
        optimizer = shard_optimizer(self.spec.optimizer_name, self.spec.shard_optimizer())
        slots = shard_optimizer_state(state.optimizer or {}, self.infos, self.placement, optimizer) \
            if optimizer is not None else [None] * len(self.shards)
        ray.get([s.load.remote(BlockData(tuple(self.placement.blocks_on(k)), values[k], moms[k], state.step, slots[k]))
                 for k, s in enumerate(self.shards)])

    def start(self, state: Checkpoint) -> None:
        """Place the blocks, start ``spec.ps`` shards and load them with ``state`` (parameters, optimizer state
        and step; no buffers: the workers hold those)."""
        import ray

        spec = self.spec
        self.placement = get_placement(spec.placement).place(self.infos, spec.ps)
        self.shards = [self.new_shard(k) for k in range(spec.ps)]
        self._load(state)
        straggler = spec.straggler_factor()
        if straggler:
            ray.get(self.shards[straggler[0]].set_slowdown.remote(straggler[1]))
        for server in self.servers:
            server.joined_at = time.time()
            self.emitter.server_event("server_joined", server)

    # -- settings pushed to every shard ----------------------------------------------------------
    def set_lr_scale(self, scale: float) -> None:
        """Multiply the learning rate on every shard (the LR policy's decision)."""
        self.lr_scale = scale
        for s in self.shards:
            self.detached.add(s.set_lr_scale.remote(scale))

    def set_num_workers(self, n: int, wait: bool = False) -> None:
        """Synchronous rounds: how many pushes make a round. ``wait``: until every shard knows (a newcomer's
        first push, which may come over a channel rather than after this call, must find the round grown)."""
        import ray

        self.num_workers = max(1, n)
        self.size_epoch += 1
        if self.spec.sync:
            refs = self._send_round_size()
            if wait:  # a dead shard is handled where pushes fail
                with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    ray.get(refs, timeout=30)
                return
            for ref in refs:
                self.detached.add(ref)

    def _send_round_size(self) -> list[Any]:
        """Tell every shard the round size with its change's number (shards apply the newest they saw)."""
        return [s.set_num_workers.remote(self.num_workers, self.size_epoch) for s in self.shards]

    def forget_worker(self, worker_id: int) -> None:
        """A worker left: every shard drops what it holds of its gradient pieces sent through Ray (an
        asynchronous shard releases the push they half-applied, so snapshots need not wait for it)."""
        for s in self.shards:
            self.detached.add(s.forget.remote(worker_id))

    def set_fence(self, step: int) -> None:
        """No push takes a shard past ``step`` (the controller's fence); awaited, so no worker pushes past it."""
        import ray

        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get([s.set_max_step.remote(step) for s in self.shards], timeout=30)  # a dead one is lost anyway

    # -- shard loss -------------------------------------------------------------------------------
    def dead_shards(self, timeout_s: float = SHARD_ANSWER_S) -> list[int]:
        """The indices of the shards that do not answer a ping: dead, or frozen (no answer within ``timeout_s``:
        a stopped or hung process). A frozen one is said (a ``shard_unresponsive`` event) and ended, so that it
        is a loss like any other and nobody waits on it."""
        import ray

        refs = [s.ping.remote() for s in self.shards]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        dead = []
        for k, ref in enumerate(refs):
            if ref in pending:
                self.detached.add(ref)
                dead.append(k)
                self.unresponsive.add(k)
                self.emitter.event("shard_unresponsive", shard_id=k, server_id=self.servers[k].server_id,
                                   details={"timeout_s": timeout_s})
                with contextlib.suppress(Exception):  # gone meanwhile: nothing to end
                    ray.kill(self.shards[k], no_restart=True)
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                dead.append(k)
        return dead

    def restore(self, state: Checkpoint, global_step: int, workers: Sequence[Any], replacements: Mapping[int, Server],
                with_buffers: bool = False) -> dict[str, Any]:
        """Put each replacement (shard index -> a spare's server, up and empty) in its dead shard's place and load
        every shard with ``state`` (a checkpoint, or the state the run started from). ``with_buffers``: the
        workers' batch-norm statistics go back too (``state``'s; a fresh model's where it has none): after a
        divergence they may hold NaN.

        Returns the ``shard_restored`` event's details.
        """
        import ray

        for k, spare in sorted(replacements.items()):
            server = self.servers[k]
            reason = "unresponsive" if k in self.unresponsive else "revoked"
            self.emitter.event("shard_lost", shard_id=k, server_id=server.server_id,
                               details={"global_step": global_step, "reason": reason})
            self.emitter.end_server(server, reason)
            if spare in self.spares:
                self.spares.remove(spare)
            self.shards[k], self.servers[k] = spare.actor, spare
        self.version += 1
        self.unresponsive.clear()
        self._load(state)
        straggler = self.spec.straggler_factor()
        if straggler and straggler[0] in replacements:
            ray.get(self.shards[straggler[0]].set_slowdown.remote(straggler[1]))
        if self.spec.sync:
            ray.get(self._send_round_size())
        ray.get([w.set_layout.remote(self.placement, self.shards) for w in workers])
        if with_buffers:
            ray.get([w.load_buffers.remote(state.buffers or None) for w in workers])
        return {"checkpoint_step": state.step, "steps_lost": max(0, global_step - state.step),
                "dead_shards": sorted(replacements)}

    # -- placement changes ------------------------------------------------------------------------
    def migrate(self, decisions: list[Decision], workers: Sequence[Any],
                removed_reason: str = "removed") -> tuple[MigrationResult, float]:
        """Carry out placement changes on quiesced shards; workers then adopt the new layout. Removed
        shards' servers end with ``removed_reason``.

        Returns the migration's result and the pause it cost (seconds).
        """
        import ray

        assert self.placement is not None
        result = execute_decisions(decisions, self.shards, self.placement, self.new_shard)
        self.shards, self.placement = result.shards, result.placement
        self.version += 1
        for actor in result.removed:
            for server in self.servers:
                if server.actor is actor and server.alive:
                    self._end(server, removed_reason)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.servers = [srv for srv in self.servers if srv.alive]
        t0 = time.perf_counter()
        ray.get([w.set_layout.remote(self.placement, self.shards) for w in workers])
        if self.spec.sync:
            ray.get(self._send_round_size())
        ray.get([s.stats.remote() for s in self.shards])  # fresh load windows under the new placement
        self.waits = [0.0] * len(self.shards)
        return result, result.pause_s + time.perf_counter() - t0

    # -- load -------------------------------------------------------------------------------------
    def add_waits(self, waits: Sequence[float]) -> None:
        """Add a chunk's per-shard send-to-reply seconds (the worker-observed wait)."""
        if len(self.waits) != len(self.shards):
            self.waits = [0.0] * len(self.shards)
        for k, v in enumerate(waits[:len(self.shards)]):
            self.waits[k] += v

    def collect_stats(self, global_step: int) -> list[Any] | None:
        """Each shard's counters since the last collection, reported as ``on_shard``; None when a shard died."""
        import ray

        try:  # bounded: a frozen shard must not hold the driver's loop (the caller then finds which)
            stats = ray.get([s.stats.remote() for s in self.shards], timeout=SHARD_ANSWER_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None
        now = time.time()
        waits = self.waits if len(self.waits) == len(stats) else [0.0] * len(stats)
        self.waits = [0.0] * len(stats)
        stats = [dataclasses.replace(st, shard_id=k, wait_s=w)
                 for k, (st, w) in enumerate(zip(stats, waits, strict=True))]
        for k, st in enumerate(stats):
            blocks = tuple(block_loads(ShardLoad.from_stats(st), self.placement)) if self.placement else ()
            self.emitter.emit("on_shard", ShardReport(self.emitter.run_id, now, global_step, k, st.pushes,
                                                      st.bytes_in, st.bytes_out, st.busy_s, st.num_params,
                                                      st.apply_s, st.queue_s, st.wait_s, blocks))
        return stats

    def _end(self, server: Server, reason: str) -> None:
        server.end(reason)
        self.emitter.server_event("server_ended", server, extra={"reason": reason})

    def release(self) -> None:
        """End every live PS server, spares included (the run is over)."""
        for server in [*self.servers, *self.spares]:
            if server.alive:
                self._end(server, "released")

    def kill_all(self) -> None:
        """Kill every shard actor (at shutdown)."""
        import ray

        for s in [*self.shards, *(srv.actor for srv in self.spares)]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(s)
