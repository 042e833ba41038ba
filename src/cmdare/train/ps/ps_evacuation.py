"""The Ray executor of the run controller's parameter-server commands.

The controller decides (:mod:`cmdare.control.shard_control`): when a PS server's notice comes, whether its
blocks go to the surviving shards or the last shard's to a replacement, when the last shard parks, when
dead shards are restored from the checkpoint. This executor acts on the run's shards:

* a replacement PS (``StartPs``) is a spare shard actor started ahead; its ping answering is ``PsUp``;
* ``EvacuatePs``: on quiesced shards, the server's blocks with their momentum move as the command's moves say
  (the controller's choice: PSLD's drain plan with ``--placement psld``, else the least-loaded shards; the last
  shard's onto the replacement); its server is released before the deadline (``shard_evacuated``);
* ``ParkPs``: the last shard's blocks are taken into the coordinator and its server released; ``UnparkPs``:
  the replacement takes them (``shard_parked``, then ``shard_evacuated``): a pause, nothing lost;
* ``FillPs``: a replacement joins a run whose other shards took the evacuated blocks, taking the blocks the
  command's moves give it (``ps_add``);
* ``KillPs``: no notice, or the deadline came first: the server is killed (``ps_revocation``); the
  controller's ``Restore`` follows: each dead server's place to the spare it names, every shard back to the
  checkpoint it names (``shard_lost``, ``shard_restored``);
* Ray's preemption drain of a shard's node is polled every :data:`DRAIN_POLL_S` and reported as ``PsNotice``.

Each PS server has the key the controller knows it by: the initial shards' ``-1, -2, ...`` in shard order,
the others' from the command that started them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from cmdare.cloud.local import Server, ServerProvider
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.kinds import ShardAction
from cmdare.ps.psld.decisions import RemoveShard
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.ps.placement_changes import PlacementChanges
from cmdare.train.ps.shard_group import ShardGroup
from cmdare.train.runtime.emitter import RunEmitter

__all__ = ["PsServerExecutor", "ps_executor"]

DRAIN_POLL_S = 0.5  # how often the GCS is asked for draining nodes (one request)

class PsServerExecutor:
    """The run's PS servers by key: spares started, blocks evacuated, parked and restored, servers killed."""

    def __init__(self, shards: ShardGroup, changes: PlacementChanges, provider: ServerProvider, emitter: RunEmitter,
                 watch_drains: bool = False):
        self.shards, self.changes, self.provider, self.emitter = shards, changes, provider, emitter
        self.watch_drains = watch_drains
        self.by_key: dict[int, Server] = {-1 - k: srv for k, srv in enumerate(shards.servers)}
        self.spares: dict[int, Server] = {}  # key -> a replacement's server (its actor started, empty)
        self.ping_refs: dict[Any, int] = {}  # a spare's ping -> its key
        self.parked: dict[int, tuple[int, Any, float]] = {}  # key -> (shard index, blocks, when parked)
        self.node_of: dict[int, str] = {}  # key -> the shard's Ray node (hex), once known
        self._node_refs: dict[int, Any] = {k: srv.actor.node_id.remote() for k, srv in self.by_key.items()}
        self._next_drain_poll = 0.0

    def _index(self, server: Server) -> int | None:
        return self.shards.shards.index(server.actor) if server.actor in self.shards.shards else None

    def key_of(self, server: Server) -> int | None:
        return next((k for k, srv in self.by_key.items() if srv is server), None)

    def dead_keys(self) -> tuple[int, ...]:
        """The keys of the shards that do not answer a ping (dead)."""
        return tuple(k for k in (self.key_of(self.shards.servers[i]) for i in self.shards.dead_shards())
                     if k is not None)

    # -- replacements ------------------------------------------------------------------------------------
    def start_spare(self, cmd: C.StartPs, wall: float) -> list[E.Event]:
        """Start the replacement PS server ``cmd.key`` (an empty shard actor); its ping answers once it is up."""
        ref = self.shards.start_spare()
        server = self.shards.spares[-1]
        self.spares[cmd.key] = server
        self.ping_refs[ref] = cmd.key
        startup = max(0.0, server.ready_at - server.requested_at) if self.provider.emulated else None
        return [E.ServerStarting(wall=wall, key=cmd.key, startup_s=startup)]

    def spare_answered(self, ref: Any, wall: float) -> list[E.Event]:
        import ray

        key = self.ping_refs.pop(ref)
        server = self.spares.get(key)
        if server is None:
            return []
        try:
            ray.get(ref)
        except ray.exceptions.RayError as err:
            self.spares.pop(key, None)
            if server in self.shards.spares:
                self.shards.spares.remove(server)
            self.emitter.end_server(server, "revoked")
            return [E.PsStartFailed(wall=wall, key=key, error=type(err).__name__)]
        self.shards.spare_ready(server)
        return [E.PsUp(wall=wall, key=key)]

    def _use_spare(self, key: int) -> Server:
        """Put spare ``key`` first in the shard group's spares (the next added shard takes it)."""
        server = self.spares.pop(key)
        self.shards.spares.remove(server)
        self.shards.spares.insert(0, server)
        self.by_key[key] = server
        self._node_refs[key] = server.actor.node_id.remote()
        return server

    # -- notices ---------------------------------------------------------------------------------------
    def noticed(self, cmd: C.PsNoticed, now: float, source: str) -> None:
        """Report a PS server's notice (``now``: cloud time, as its deadline)."""
        server = self.by_key.get(cmd.key)
        if server is None:
            return
        self.emitter.event("ps_notice", server_id=server.server_id,
                           details={"shard_id": self._index(server), "lead_s": cmd.deadline - now,
                                    "deadline": cmd.deadline, "onto": cmd.onto, "source": source,
                                    "uptime_s": server.uptime_s()})

    def poll_drains(self, wall: float, noticed: Callable[[int], bool]) -> list[E.Event]:
        """Shard servers whose Ray node is draining (a preemption), as notices with their deadlines."""
        import ray

        from cmdare.cloud.drain_watcher import drain_deadline, draining_nodes

        if not self.watch_drains or wall < self._next_drain_poll:
            return []
        self._next_drain_poll = wall + DRAIN_POLL_S
        for key, ref in list(self._node_refs.items()):
            done, _ = ray.wait([ref], timeout=0)
            if done:
                del self._node_refs[key]
                with contextlib.suppress(ray.exceptions.RayError):  # a dead shard is handled where pushes fail
                    self.node_of[key] = ray.get(ref)
        live = {k: node for k, node in self.node_of.items() if k in self.by_key and not noticed(k)}
        if not live:
            return []
        try:
            drains = draining_nodes()
        except Exception:  # noqa: BLE001 - a GCS hiccup: look again at the next poll
            return []
        return [E.PsNotice(wall=wall, key=key, deadline=drain_deadline(drains[node], wall))
                for key, node in live.items() if node in drains]

    # -- actions on quiesced shards ----------------------------------------------------------------------
    def evacuate(self, cmd: C.EvacuatePs, workers: Sequence[Any], global_step: int, wall: float,
                 now: float) -> E.ActionDone:
        """The controller's moves carried out: the server's blocks onto the survivors or onto the spare named."""
        server = self.by_key[cmd.key]
        k = self._index(server)
        if k is None or RemoveShard(k) not in cmd.moves:
            raise RuntimeError(f"the evacuation of PS server {cmd.key} (shard {k}) does not remove its shard: "
                               f"{cmd.moves}")
        if cmd.spare is not None:  # the last shard: the spare is added, takes every block, the old is removed
            self._use_spare(cmd.spare)
        result, pause_s = self.changes.migrate(list(cmd.moves), workers, global_step, removed_reason="evacuated")
        if result.rolled_back:  # a destination died: the shard stays; the deadline (or a retry) decides
            return E.ActionDone(wall=wall, action=ShardAction.EVACUATE, ok=False, num_shards=len(self.shards.shards))
        self.by_key.pop(cmd.key, None)
        self.emitter.event("shard_evacuated", server_id=server.server_id,
                           details={"shard_id": k, "onto": cmd.onto, "moved_bytes": result.moved_bytes,
                                    "pause_s": pause_s, "margin_s": cmd.deadline - now,
                                    "num_shards": len(self.shards.shards), "global_step": global_step})
        if cmd.spare is not None:
            self._replacement_joined()
        return E.ActionDone(wall=wall, action=ShardAction.EVACUATE, num_shards=len(self.shards.shards))

    def park(self, cmd: C.ParkPs, wall: float, now: float) -> E.ActionDone:
        """Take the shard's blocks into the coordinator and release its server (training waits)."""
        import ray

        server = self.by_key.pop(cmd.key)
        k = self._index(server)
        placement = self.shards.placement
        assert placement is not None and k is not None
        data = ray.get(server.actor.take.remote([b.block_id for b in placement.blocks_on(k)]))
        self.parked[cmd.key] = (k, data, time.time())
        self.shards.end_server(server, "evacuated")
        with contextlib.suppress(Exception):
            ray.kill(server.actor, no_restart=True)
        self.emitter.event("shard_parked", server_id=server.server_id,
                           details={"shard_id": k, "moved_bytes": int(data.nbytes),
                                    "margin_s": cmd.deadline - now})
        return E.ActionDone(wall=wall, action=ShardAction.PARK, num_shards=len(self.shards.shards))

    def unpark(self, cmd: C.UnparkPs, workers: Sequence[Any], global_step: int, wall: float) -> E.ActionDone:
        """The replacement takes the parked blocks in the parked shard's place."""
        import ray

        k, data, parked_at = self.parked.pop(cmd.key)
        t0 = time.perf_counter()
        server = self._use_spare(cmd.spare)
        self.shards.spares.remove(server)
        self.shards.replace_shard(k, server)
        ray.get(self.shards.shards[k].add.remote(data))
        self.shards.set_num_workers(self.shards.num_workers)
        ray.get([w.set_layout.remote(self.shards.placement, self.shards.shards) for w in workers])
        self.emitter.event("shard_evacuated", details={
            "shard_id": k, "onto": "replacement", "parked": True, "parked_s": time.time() - parked_at,
            "moved_bytes": int(data.nbytes), "pause_s": time.perf_counter() - t0,
            "num_shards": len(self.shards.shards), "global_step": global_step})
        self._replacement_joined()
        return E.ActionDone(wall=wall, action=ShardAction.UNPARK, num_shards=len(self.shards.shards))

    def fill(self, cmd: C.FillPs, workers: Sequence[Any], global_step: int, wall: float) -> E.ActionDone:
        """The replacement joins and takes its share of the blocks."""
        self._use_spare(cmd.spare)
        result, _pause = self.changes.migrate(list(cmd.moves), workers, global_step)
        if not result.rolled_back:
            self._replacement_joined()
        return E.ActionDone(wall=wall, action=ShardAction.FILL, ok=not result.rolled_back,
                            num_shards=len(self.shards.shards))

    def _replacement_joined(self) -> None:
        """A replacement PS server took blocks: it joined the run (counted as a replacement)."""
        self.emitter.event("ps_replacement_joined", details={"num_shards": len(self.shards.shards)})

    def kill(self, cmd: C.KillPs) -> None:
        """Revoke the PS server now: its shard dies with its updates (a restore follows)."""
        import ray

        server = self.by_key.get(cmd.key)
        if server is None or not server.alive:
            return
        self.provider.revoke(server)
        with contextlib.suppress(Exception):  # providers that place PS servers on shared nodes kill only the actor
            ray.kill(server.actor, no_restart=True)
        server.end("revoked")  # billed to now, not to the restore (its ``server_ended`` event comes with the restore)
        self.emitter.event("ps_revocation", server_id=server.server_id,
                           details={"shard_id": self._index(server), "reason": cmd.reason, "source": "injected",
                                    "uptime_s": server.uptime_s(), "noticed": cmd.reason == "deadline_passed"})

    def restore(self, cmd: C.Restore, load: Callable[[], Checkpoint], workers: Sequence[Any], global_step: int,
                wall: float, details: dict[str, Any] | None = None) -> list[E.Event]:
        """Each dead shard's server replaced by the spare the controller named, every shard loaded with ``load()``
        (the checkpoint the controller chose, or the state the run started from; read only once the restore can
        go ahead); ``details`` go into the
        ``shard_restored`` event. A dead shard or a spare the command does not know of (one found dead since) is
        reported instead, and nothing is done: the controller decides again."""
        unknown = tuple(k for k in self.dead_keys() if k not in cmd.dead)
        gone = [k for k in cmd.spares if k not in self.spares]
        indices = {dead: self._index(self.by_key[dead]) if dead in self.by_key else None for dead in cmd.dead}
        if unknown or gone or None in indices.values():
            return [*([E.ShardLost(wall=wall, keys=unknown)] if unknown else []),
                    *(E.PsStartFailed(wall=wall, key=k, error="gone before the restore") for k in gone),
                    E.ActionDone(wall=wall, action=ShardAction.RESTORE, ok=False, num_shards=len(self.shards.shards))]
        state = load()
        servers = {spare: self.spares.pop(spare) for spare in cmd.spares}
        done = self.shards.restore(state, global_step, workers,
                                   {indices[dead]: servers[spare] for dead, spare in cmd.replacements},
                                   with_buffers=cmd.reason == "diverged")
        for dead, spare in cmd.replacements:
            del self.by_key[dead]
            self.by_key[spare] = servers[spare]
            self._node_refs[spare] = servers[spare].actor.node_id.remote()
            self._replacement_joined()  # a replacement server holds a lost shard's blocks (as the simulator counts)
        self.emitter.event("shard_restored", details={**done, "from_checkpoint": cmd.checkpoint is not None,
                                                      **(details or {})})
        return [E.ActionDone(wall=wall, action=ShardAction.RESTORE, step=state.step,
                             num_shards=len(self.shards.shards))]

    def placement_changed(self, new_keys: Sequence[int], added: Sequence[Server]) -> tuple[int, ...]:
        """After a placement change: the added shards' servers get their keys; returns the removed servers' keys."""
        self.by_key.update(zip(new_keys, added, strict=False))
        removed = tuple(k for k, srv in self.by_key.items() if srv not in self.shards.servers)
        for key in removed:
            del self.by_key[key]
        return removed


def ps_executor(spec: Any, shards: ShardGroup, changes: PlacementChanges, provider: ServerProvider,
                emitter: RunEmitter) -> PsServerExecutor:
    """The PS executor of a run; with ``--ps-transient`` it watches Ray's drains of the shards' nodes."""
    return PsServerExecutor(shards, changes, provider, emitter, watch_drains=spec.ps_transient)
