"""Parameter servers on spot servers: the Ray executor of the PS kernel's decisions.

The kernel (:class:`~cmdare.control.PsServerKernel`) says when a PS server's notice comes and what
follows; this executor carries it out on the run's shards:

* a notice (an injected one, or Ray's preemption drain of the shard's node, polled every
  :data:`DRAIN_POLL_S`): the server is marked for evacuation and a replacement PS starts (a spare shard actor);
  the coordinator stops handing out work, and once no push is in flight (an iteration boundary) the
  shard's blocks with their momentum move to the surviving shards (the placement strategy's choice:
  PSLD's balancer with ``--placement psld``, else the least-loaded shards) or, for the last shard, to
  the replacement; its server is released before the deadline (``shard_evacuated``);
* the last shard whose replacement is not up by half its notice (or 5 s before the deadline) parks:
  its blocks with their momentum are taken into the coordinator at a boundary, the server is released,
  and training waits until the replacement is up and takes them (``shard_parked``, then
  ``shard_evacuated``): a pause, nothing lost;
* the replacement is up: it is added and filled at the next boundary (``ps_add``, a rebalance);
* no notice, or the deadline came first: the server is killed; the workers' next push fails and every
  shard rolls back to the latest checkpoint (``shard_restored``, with the steps lost).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.control import Evacuate, PsServerInfo, PsServerKernel, RequestPsReplacement, RestoreShards
from cmdare.ps.placement import Placement
from cmdare.ps.psld.decisions import AddShard, Decision, Move, RemoveShard
from cmdare.train.balancing import drain_moves, fill_moves
from cmdare.train.emitter import RunEmitter
from cmdare.train.placement_changes import PlacementChanges
from cmdare.train.shard_group import ShardGroup

__all__ = ["PsServerExecutor", "spot_ps_executor"]

DRAIN_POLL_S = 0.5  # how often the GCS is asked for draining nodes (one request)
PARK_MARGIN_S = 5.0  # a last shard parks its blocks at least this long before its deadline

#: Where an evacuated shard's blocks go: (placement, shard) -> decisions that empty and remove it.
DrainPlan = Callable[[Placement, int], list[Decision]]


def default_drain(placement: Placement, shard: int) -> list[Decision]:
    """Move the shard's blocks to the least-loaded survivors, then remove it."""
    return [*drain_moves(placement, shard), RemoveShard(shard)]


class PsServerExecutor:
    """Notices, evacuations, replacements and kills of a run's transient PS servers."""

    def __init__(self, kernel: PsServerKernel, shards: ShardGroup, changes: PlacementChanges,
                 provider: ServerProvider, emitter: RunEmitter, drain: DrainPlan | None = None,
                 fill: Callable[[Placement], list[Decision]] | None = None):
        self.kernel, self.shards, self.changes = kernel, shards, changes
        self.provider, self.emitter = provider, emitter
        self.drain = drain or default_drain
        self.fill = fill or (lambda p: [AddShard(), *fill_moves(p, p.num_shards)])
        self.by_key: dict[int, Server] = {}
        self.node_of: dict[int, str] = {}  # key -> the shard's Ray node (hex), once known
        self._node_refs: dict[int, Any] = {}
        self._next_drain_poll = 0.0
        self.evacuations: dict[int, Evacuate] = {}  # noticed, blocks not yet moved
        self.noticed_at: dict[int, float] = {}
        self.parked: dict[int, tuple[int, Any, Evacuate, float]] = {}  # key -> (shard, blocks, notice, when)
        self.starting: dict[Any, Server] = {}  # spare's ping reference -> its server
        self._fills = 0  # spares to add and fill at the next boundary
        self.planned = len(shards.shards)  # the PS count replacements restore
        # told when a shard is killed: its loss must be handled (restored) also with no push in flight to fail
        self.on_killed: Callable[[], None] = lambda: None

    # -- what the coordinator asks ------------------------------------------------------------
    def sync(self, now: float | None = None) -> None:
        """Register the shards' live servers the kernel does not know; forget the ended ones."""
        now = time.time() if now is None else now
        known = {srv.server_id for srv in self.by_key.values()}
        for server in self.shards.servers:
            if server.alive and server.server_id not in known:
                key = self.kernel.add(server.spec, now).worker_id
                self.by_key[key] = server
                self._node_refs[key] = server.actor.node_id.remote()
        for key, server in list(self.by_key.items()):
            if not server.alive:
                self.kernel.remove(key)
                self.evacuations.pop(key, None)
                del self.by_key[key]
                self.node_of.pop(key, None)
                self._node_refs.pop(key, None)

    def candidates(self) -> list[PsServerInfo]:
        """PS servers a periodic or scripted revocation source may pick now."""
        return [info for info in self.kernel.candidates() if info.worker_id in self.by_key]

    @property
    def holding(self) -> bool:
        """Whether work must stop at the next boundary: an evacuation or a fill can be carried out."""
        now = time.time()
        return bool(self._fills) or bool(self.parked) or any(
            self._can_evacuate(d) or self._must_park(k, d, now) for k, d in self.evacuations.items())

    def tick(self, now: float, picked: Sequence[int] = ()) -> None:
        """Act on notices due now (lifetimes ending within the notice lead, and the source's picks) and on
        deadlines passed."""
        for key in [*self.kernel.notices_due(now), *self.kernel.pick(picked)]:
            self._act(self.kernel.revoke(key, now, len(self.shards.shards)), now)
        if now >= self._next_drain_poll:
            self._next_drain_poll = now + DRAIN_POLL_S
            for key, deadline in self._drained(now).items():
                self._act(self.kernel.revoke(key, now, len(self.shards.shards), deadline=deadline), now, "ray")
        for d in self.kernel.deadline_passed(now):
            self._kill(d, now)

    def started(self, ref: Any) -> None:
        """A spare answered its ping: it joins; unless an evacuation is waiting for it, it is filled."""
        import ray

        server = self.starting.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            self.shards.spares.remove(server)
            self.emitter.end_server(server, "revoked")
            return
        self.shards.spare_ready(server)
        if not any(d.onto == "replacement" for d in self.evacuations.values()):
            self._fills += 1

    def carry_out(self, workers: Sequence[Any], global_step: int) -> None:
        """On quiesced shards: evacuate what can be, then add and fill the spares that are up."""
        for key, d in list(self.evacuations.items()):
            if self._can_evacuate(d):
                self._evacuate(key, d, workers, global_step)
            elif self._must_park(key, d, time.time()):
                self._park(key, d)
        spare_up = bool(self.shards.spares) and self.shards.spares[0].joined_at is not None
        for key in list(self.parked)[:1] if spare_up else []:
            self._unpark(key, workers, global_step)
        while self._fills and self.shards.spares and self.shards.spares[0].joined_at is not None:
            self._fills -= 1
            placement = self.shards.placement
            assert placement is not None
            result, _pause = self.changes.migrate(self.fill(placement), workers, global_step)
            if not result.rolled_back:
                self.emitter.event("ps_replacement_joined", details={"num_shards": len(self.shards.shards)})
        self._fills = 0 if not self.shards.spares else self._fills
        self.sync()

    # -- decisions --------------------------------------------------------------------------------
    def _drained(self, now: float) -> dict[int, float]:
        """Shard servers whose Ray node is draining (a preemption), with their deadlines."""
        import ray

        from cmdare.cloud.drain_watcher import drain_deadline, draining_nodes

        for key, ref in list(self._node_refs.items()):
            done, _ = ray.wait([ref], timeout=0)
            if done:
                del self._node_refs[key]
                with contextlib.suppress(ray.exceptions.RayError):  # a dead shard is handled where pushes fail
                    self.node_of[key] = ray.get(ref)
        if not self.node_of:
            return {}
        try:
            drains = draining_nodes()
        except Exception:  # noqa: BLE001 - a GCS hiccup: look again at the next poll
            return {}
        return {key: drain_deadline(drains[node], now) for key, node in self.node_of.items()
                if node in drains and key not in self.kernel.noticed}

    def _act(self, decisions: Sequence[Any], now: float, source: str = "injected") -> None:
        for d in decisions:
            if isinstance(d, Evacuate):
                server = self.by_key[d.key]
                self.evacuations[d.key] = d
                self.noticed_at[d.key] = now
                self.emitter.event("ps_notice", server_id=server.server_id,
                                   details={"shard_id": self._index(server), "lead_s": d.deadline - now,
                                            "deadline": d.deadline, "onto": d.onto, "source": source,
                                            "uptime_s": server.uptime_s()})
            elif isinstance(d, RequestPsReplacement) and self._missing() > 0:
                ref = self.shards.start_spare()
                self.starting[ref] = self.shards.spares[-1]
            elif isinstance(d, RestoreShards):
                self._kill(d, now)

    def _missing(self) -> int:
        """PS servers the run lacks: planned, less the shards that stay and the spares on their way."""
        staying = len(self.shards.shards) - len(self.evacuations)
        return max(self.planned, 1) - staying - len(self.shards.spares)

    def _can_evacuate(self, d: Evacuate) -> bool:
        if d.onto == "survivors":
            return len(self.shards.shards) > 1
        return bool(self.shards.spares) and self.shards.spares[0].joined_at is not None

    def _must_park(self, key: int, d: Evacuate, now: float) -> bool:
        """The last shard's replacement is not up and half the notice is gone (a notice under
        ``2 * PARK_MARGIN_S``: at once): its blocks must leave now."""
        if d.onto != "replacement" or self._can_evacuate(d):
            return False
        lead = d.deadline - self.noticed_at.get(key, now)
        return now >= d.deadline - max(lead / 2, PARK_MARGIN_S)

    def _park(self, key: int, d: Evacuate) -> None:
        """Take the shard's blocks into the coordinator and release its server (training waits)."""
        import ray

        server = self.by_key[key]
        k = self._index(server)
        placement = self.shards.placement
        assert placement is not None and k is not None
        data = ray.get(server.actor.take.remote([b.block_id for b in placement.blocks_on(k)]))
        self.parked[key] = (k, data, d, time.time())
        del self.evacuations[key]
        self.kernel.remove(key)
        self.shards.end_server(server, "evacuated")
        with contextlib.suppress(Exception):
            ray.kill(server.actor, no_restart=True)
        self.emitter.event("shard_parked", server_id=server.server_id,
                           details={"shard_id": k, "moved_bytes": int(data.params.nbytes + data.momentum.nbytes),
                                    "margin_s": d.deadline - time.time()})

    def _unpark(self, key: int, workers: Sequence[Any], global_step: int) -> None:
        """The replacement is up: it takes the parked blocks in the parked shard's place."""
        import ray

        k, data, d, parked_at = self.parked.pop(key)
        t0 = time.perf_counter()
        self.shards.replace_shard(k, self.shards.spares.pop(0))
        actor = self.shards.shards[k]
        ray.get(actor.add.remote(data))
        self.shards.set_num_workers(self.shards.num_workers)
        ray.get([w.set_layout.remote(self.shards.placement, self.shards.shards) for w in workers])
        self.by_key.pop(key, None)
        self.emitter.event("shard_evacuated", details={
            "shard_id": k, "onto": "replacement", "parked": True, "parked_s": time.time() - parked_at,
            "moved_bytes": int(data.params.nbytes + data.momentum.nbytes), "pause_s": time.perf_counter() - t0,
            "margin_s": d.deadline - parked_at, "num_shards": len(self.shards.shards), "global_step": global_step})

    def _evacuate(self, key: int, d: Evacuate, workers: Sequence[Any], global_step: int) -> None:
        server = self.by_key[key]
        k = self._index(server)
        placement = self.shards.placement
        assert placement is not None and k is not None
        if d.onto == "survivors" and len(self.shards.shards) > 1:
            decisions = self.drain(placement, k)
        else:  # onto the spare: it becomes shard n, then shard k is emptied into it and removed
            n = placement.num_shards
            decisions = [AddShard(), *(Move(b.block_id, k, n) for b in placement.blocks_on(k)), RemoveShard(k)]
        result, pause_s = self.changes.migrate(decisions, workers, global_step, removed_reason="evacuated")
        if result.rolled_back:  # a destination died: the shard stays; the deadline (or a retry) decides
            return
        del self.evacuations[key]
        self.kernel.remove(key)
        self.by_key.pop(key, None)
        self.emitter.event("shard_evacuated", server_id=server.server_id,
                           details={"shard_id": k, "onto": d.onto, "moved_bytes": result.moved_bytes,
                                    "pause_s": pause_s, "margin_s": d.deadline - time.time(),
                                    "num_shards": len(self.shards.shards), "global_step": global_step})

    def _kill(self, d: RestoreShards, now: float) -> None:
        import ray

        server = self.by_key.get(d.key)
        self.kernel.remove(d.key)
        self.evacuations.pop(d.key, None)
        if server is None or not server.alive:
            return
        self.provider.revoke(server)
        with contextlib.suppress(Exception):  # providers that place PS servers on shared nodes kill only the actor
            ray.kill(server.actor, no_restart=True)
        self.emitter.event("ps_revocation", server_id=server.server_id,
                           details={"shard_id": self._index(server), "reason": d.reason, "source": "injected",
                                    "uptime_s": server.uptime_s(), "noticed": d.reason == "deadline_passed"})
        self.on_killed()

    def _index(self, server: Server) -> int | None:
        return self.shards.shards.index(server.actor) if server.actor in self.shards.shards else None


def spot_ps_executor(spec: Any, plan: Any, revocations: Any, shards: ShardGroup, changes: PlacementChanges,
                     provider: ServerProvider, emitter: RunEmitter, decisions: Any) -> PsServerExecutor:
    """The executor of a ``--ps-transient`` run: the run's revocation source (when ``hit`` names PS
    servers), the notice lead of the spec's cloud, and PSLD's balancer choosing where blocks go with
    ``--placement psld``."""
    from cmdare.control import NoRevocations
    from cmdare.errors import UserInputError
    from cmdare.train.balancing import PsldSource

    source = revocations if plan.hits("ps") else NoRevocations()
    kernel = PsServerKernel(source, notice_s=plan.notice_lead_s(spec.cloud), replace=spec.replace != "none")
    psld = next((s for s in getattr(decisions, "sources", [decisions]) if isinstance(s, PsldSource)), None)
    drain, fill = None, None
    if psld is not None:
        def drain(_placement: Placement, shard: int) -> list[Decision]:
            return psld.remove_shard(shard)

        def fill(placement: Placement) -> list[Decision]:
            try:
                return psld.add_shard()
            except UserInputError:  # at the balancer's maximum: fill by bytes
                return [AddShard(), *fill_moves(placement, placement.num_shards)]

    executor = PsServerExecutor(kernel, shards, changes, provider, emitter, drain, fill)
    executor.sync()
    return executor
