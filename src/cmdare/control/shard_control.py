"""The parameter-server side of a run as the controller sees it: PS servers, their notices and revocations,
replacements, and the actions on quiesced shards (evacuate, park, unpark, fill, restore, placement changes).

The PS kernel (:class:`~cmdare.control.ps_servers.PsServerKernel`) says when a transient PS server's notice
comes and whether its blocks can leave (onto the other shards, or the last shard's onto a replacement);
this part keeps the replacements (spares) and the work waiting for quiesced shards, and decides, at each
pass, which action runs next:

1. a **restore** (a shard died: every shard rolls back to the newest checkpoint this run stored), once the
   replacement servers of the dead shards are ready and no checkpoint is on its way to storage (for at most
   :data:`UPLOAD_WAIT_S`); each dead server's place goes to the spare asked for it;
2. an **evacuation** of a noticed server (onto the survivors; the last shard's onto a ready replacement);
3. a **park** of the last shard whose replacement is not ready by half its notice (at least
   ``park_margin_s`` before the deadline): its blocks wait in the coordinator, training pauses;
4. an **unpark** once the replacement is ready; a **fill** of a replacement that joins a run whose other
   shards took the evacuated blocks;
5. **placement changes** (``cmdare ps`` requests, balancers).

The initial shards' servers have keys ``-1, -2, ...`` in shard order; every later PS server gets its key
from the command that starts it (:class:`~cmdare.control.run_commands.StartPs`, or the ``new_keys`` of a
placement change).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.duties import DutySchedule
from cmdare.control.kinds import Destination
from cmdare.control.ps_servers import Evacuate, PsServerKernel, RequestPsReplacement, RestoreShards
from cmdare.control.run_commands import (
    ChangePlacement,
    Command,
    EvacuatePs,
    FillPs,
    KillPs,
    ParkPs,
    PsNoticed,
    Restore,
    StartPs,
    UnparkPs,
)
from cmdare.control.run_config import RunConfig
from cmdare.ps.psld.decisions import AddShard, RemoveShard

__all__ = ["MAX_SPARE_TRIES", "UPLOAD_WAIT_S", "ShardControl", "Spare"]

MAX_SPARE_TRIES = 3  # replacement PS servers started for one lost server before the run gives up
UPLOAD_WAIT_S = 120.0  # a restore waits this long (wall time) for a checkpoint's upload: it may be the newest


@dataclass
class Spare:
    """A replacement PS server: asked for, ready in cloud time at ``ready_at``, its actor up or not."""

    key: int
    replaces: int
    requested_wall: float = 0.0
    ready_at: float | None = None  # None: when its actor is up
    up: bool = False
    heard: bool = False  # its start was answered (``ServerStarting``): its ready time is known
    attempt: int = 1

    def ready(self, now: float) -> bool:
        return self.up and (self.ready_at is None or self.ready_at <= now)


class ShardControl:
    """PS servers, spares and the actions waiting for quiesced shards; appends commands to ``out``."""

    def __init__(self, config: RunConfig, kernel: PsServerKernel, out: list[Command],
                 duties: DutySchedule | None = None):
        self.config, self.kernel, self.out = config, kernel, out
        #: the fleet's duty schedule: the checkpoints this run stored, the uploads under way
        self.duties = duties or DutySchedule(config.checkpoint_every, config.eval_every, config.steps)
        self.spec: ServerSpec | None = None
        self.num_shards = 0
        self.planned = 0  # the PS count replacements restore
        self.evacuations: dict[int, Evacuate] = {}
        self.noticed_at: dict[int, float] = {}
        self.spares: dict[int, Spare] = {}
        self.parked: dict[int, float] = {}  # key -> deadline of the parked shard's server
        self.dead: set[int] = set()  # keys of shards lost with their updates (a restore is due)
        self.restore_reason: str | None = None
        self.placements: list[tuple[tuple, tuple[int, ...], str]] = []  # (decisions, added shards' keys, why)
        self.evacuated = 0
        self.order: list[int] = []  # the servers' keys in shard order (a parked shard keeps its place)
        self.wall = 0.0  # the driver's clock at the event being handled (set by the controller)
        self.failure: str | None = None  # why the run cannot go on (replacements that never come up)

    def start(self, spec: ServerSpec, num_shards: int, now: float) -> None:
        """The initial shards' servers (keys -1, -2, ... in shard order)."""
        self.spec, self.num_shards, self.planned = spec, num_shards, num_shards
        self.order = [self.kernel.add(spec, now).worker_id for _ in range(num_shards)]

    def snapshot(self) -> dict[str, Any] | None:
        """The PS servers in shard order with their ready times and drawn lifetimes, as JSON-able values; None while
        the shards are not at rest (a notice, an evacuation, a parked or dead shard, a spare on its way): a resumed
        run then starts its PS servers afresh."""
        if self.evacuations or self.kernel.noticed or self.spares or self.parked or self.dead or \
                len(self.order) != self.num_shards:
            return None
        servers = [[s.server.as_dict(), s.ready_at, self.kernel.deadlines.get(s.worker_id)]
                   for s in (self.kernel.servers[k] for k in self.order)]
        return {"next_key": self.kernel.issued, "keys": list(self.order), "servers": servers}

    def resume(self, saved: dict[str, Any] | None) -> None:
        """After :meth:`start`: the started shards' servers are the saved run's (:meth:`snapshot`), in shard order,
        ready and revoked when they were to be. Their keys are -1, -2, ... again (a driver keys the shards it starts
        so), in place of the saved ``keys``; keys asked for later go on from the saved run's. Nothing changes
        when none was saved, or not as many shards."""
        if not saved or len(saved["servers"]) != len(self.order):
            return
        for key, (server, ready_at, deadline) in zip(self.order, saved["servers"], strict=True):
            self.kernel.adopt(key, ServerSpec.from_dict(server), ready_at, deadline)
        self.kernel.issue_from(saved["next_key"])

    def index_of(self, key: int) -> int:
        """The shard index of PS server ``key``'s shard."""
        return self.order.index(key)

    def _reorder(self, decisions: tuple, added: tuple[int, ...]) -> None:
        """The shard order after placement changes carried out: each added shard's server (``added``, in order)
        last, each removed shard's place gone (indices above it shift down, as the placement's)."""
        keys = iter(added)
        for d in decisions:
            if isinstance(d, AddShard):
                self.order.append(next(keys))
            elif isinstance(d, RemoveShard):
                self.order.pop(d.shard_id)

    # -- what happened ----------------------------------------------------------------------------
    def candidates(self) -> list:
        """PS servers a periodic or scripted revocation source may pick now."""
        return self.kernel.candidates() if self.config.hit_ps else []

    def tick(self, now: float, picked: list[int], due_by: float | None = None) -> None:
        """Notices due by ``due_by`` (default ``now``, the time recorded): lifetimes ending within the notice lead,
        and the source's picks; deadlines passed."""
        due_by = now if due_by is None else due_by
        for key in [*self.kernel.notices_due(due_by), *self.kernel.pick(picked)]:
            self._act(self.kernel.revoke(key, now, self.num_shards), now)
        for d in self.kernel.deadline_passed(due_by):
            if d.key in self.kernel.servers:
                self._kill(d.key, d.reason)

    def notice(self, key: int, deadline: float, now: float) -> None:
        """A drain (a real notice) of PS server ``key``'s node."""
        self._act(self.kernel.revoke(key, now, self.num_shards, deadline=deadline), now)

    def lost(self, keys: tuple[int, ...]) -> None:
        """Shards died (found dead by the driver): a restore is due, with replacements for their servers."""
        for key in keys or ():
            if key in self.kernel.servers:
                self._kill(key, "lost", command=False)
        if not keys:
            self.restore_reason = self.restore_reason or "lost"

    def request_placement(self, decisions: tuple, why: str = "the balancer or a request moved blocks") -> None:
        """Placement changes to carry out on quiesced shards (each added shard's server gets a key now)."""
        adds = sum(isinstance(d, AddShard) for d in decisions)
        self.placements.append((tuple(decisions), tuple(self.kernel.next_key() for _ in range(adds)), why))

    def spare_starting(self, key: int, startup_s: float | None, now: float) -> None:
        spare = self.spares.get(key)
        if spare is not None:
            spare.heard = True
            spare.ready_at = None if startup_s is None else now + max(0.0, startup_s)

    def spare_up(self, key: int) -> None:
        spare = self.spares.get(key)
        if spare is not None:
            spare.up = True

    def spare_failed(self, key: int, why: str = "it died while starting") -> None:
        """A replacement did not come up: ask for another one (three tries per server replaced)."""
        spare = self.spares.pop(key, None)
        if spare is None:
            return
        if spare.attempt >= MAX_SPARE_TRIES:
            self.failure = f"no replacement parameter server came up in {MAX_SPARE_TRIES} tries ({why})"
            return
        self._request(spare.replaces, spare.attempt + 1)

    def expire(self, wall: float) -> None:
        """Replacements whose actor is not up within the start time-out are tried again."""
        for spare in list(self.spares.values()):
            if not spare.up and wall - spare.requested_wall >= self.config.start_timeout_s:
                self.spare_failed(spare.key, f"not up within {self.config.start_timeout_s:g} s")

    def next_wall(self) -> float:
        """The next wall time something is due: a spare's start time-out; a restore that stops waiting for an
        upload."""
        times = [s.requested_wall + self.config.start_timeout_s for s in self.spares.values() if not s.up]
        if self.dead or self.restore_reason is not None:
            times += [began + UPLOAD_WAIT_S for began in self.duties.uploading.values()]
        return min(times, default=math.inf)

    # -- decisions --------------------------------------------------------------------------------
    def _act(self, decisions: list, now: float) -> None:
        for d in decisions:
            if isinstance(d, Evacuate):
                self.evacuations[d.key] = d
                self.noticed_at[d.key] = now
                self.out.append(PsNoticed(d.key, d.deadline, d.onto,
                                          why=f"its cloud's notice: its blocks go to the {d.onto} before the deadline"))
            elif isinstance(d, RequestPsReplacement) and self._missing() > 0:
                self._request(d.replaces)
            elif isinstance(d, RestoreShards):
                self._kill(d.key, d.reason)

    def _request(self, replaces: int, attempt: int = 1) -> None:
        key = self.kernel.next_key()
        self.spares[key] = Spare(key, replaces, self.wall, attempt=attempt)
        self.out.append(StartPs(key, replaces, why=f"PS server {replaces} is going: its replacement"))

    def _missing(self) -> int:
        """PS servers the run lacks: planned, less the shards that stay and the spares on their way."""
        staying = self.num_shards - len(self.evacuations) - len(self.dead)
        return max(self.planned, 1) - staying - len(self.spares)

    def _kill(self, key: int, reason: str, command: bool = True) -> None:
        """Server ``key`` dies with its shard: a restore from the checkpoint is due (with a replacement)."""
        if command:
            self.out.append(KillPs(key, reason, why=f"revoked ({reason})"))
        self.kernel.remove(key)
        self.evacuations.pop(key, None)
        self.dead.add(key)
        self.restore_reason = self.restore_reason or reason
        if self._missing() > 0:
            self._request(key)

    def roll_back(self, reason: str) -> None:
        """Roll every shard back to the newest stored checkpoint (training diverged): a :class:`Restore` that
        replaces no shard."""
        self.restore_reason = self.restore_reason or reason

    # -- actions on quiesced shards ---------------------------------------------------------------
    def _ready_spares(self, now: float) -> list[Spare]:
        return [s for s in self.spares.values() if s.ready(now)]

    def _park_at(self, key: int, d: Evacuate) -> float:
        lead = d.deadline - self.noticed_at.get(key, d.deadline)
        return d.deadline - max(lead / 2, self.config.park_margin_s)

    def blocked(self, now: float) -> bool:
        """Whether no training can happen: a shard is dead (restore due) or parked, or a replacement PS's emulated
        start-up has ended but its process has not answered yet. Cloud time is the run's steps: the emulator's own
        process start must not let training run past the step the replacement is ready at (its fill, the last
        shard's evacuation onto it, an unpark, a restore fall at that step, as in the simulator), nor end the run
        before it."""
        if self.dead or self.restore_reason is not None or self.parked:
            return True
        return any(not s.up and s.ready_at is not None and s.ready_at <= now for s in self.spares.values())

    def next_action(self, now: float) -> Command | None:
        """The action to carry out on quiesced shards now, or None (the caller holds training while
        :meth:`blocked`)."""
        ready = self._ready_spares(now)
        if self.dead or self.restore_reason is not None:
            if len(ready) >= len(self.dead) and not self.duties.uploads_since(self.wall - UPLOAD_WAIT_S):
                return self._restore(ready)
            return None  # the dead shards' replacements are not all up, or a checkpoint is on its way to storage
        for key, d in self.evacuations.items():
            if d.onto == Destination.SURVIVORS and self.num_shards > 1:
                return EvacuatePs(key, Destination.SURVIVORS, d.deadline,
                                  why="noticed: its blocks move to the other shards before its deadline")
            if ready:
                return EvacuatePs(key, Destination.REPLACEMENT, d.deadline, ready[0].key,
                                  why="noticed, the last shard: its blocks move to its replacement, which is up")
            if now >= self._park_at(key, d):
                return ParkPs(key, d.deadline, why="noticed, the last shard, its replacement not up before the "
                                                   "deadline: its state waits in storage")
        if self.parked and ready:
            return UnparkPs(next(iter(self.parked)), ready[0].key, why="the parked shard's replacement is up")
        if ready:  # wanted by no dead, noticed or parked shard: it joins and takes its share of blocks
            return FillPs(ready[0].key, why="a replacement PS is up: it takes its share of the blocks")
        if self.placements:
            decisions, new_keys, why = self.placements[0]
            return ChangePlacement(decisions, new_keys, why=why)
        return None

    def _restore(self, ready: list[Spare]) -> Restore:
        """Every dead server's place to a ready spare (the one asked for it, else the first asked for of those
        left), every shard back to the newest checkpoint this run stored."""
        reason = self.restore_reason or "lost"
        free = list(ready)
        pairs = []
        for dead in sorted(self.dead, reverse=True):  # keys -1, -2, ... then later servers': oldest first
            spare = next((s for s in free if s.replaces == dead), free[0])
            free.remove(spare)
            pairs.append((dead, spare.key))
        step = self.duties.latest_checkpoint()
        back = f"the checkpoint of step {step}" if step is not None else "the state the run started from"
        return Restore(reason, tuple(pairs), step, why=f"shards {reason}: back to {back}, the newest this run stored")

    def done(self, command: Command, ok: bool, now: float, num_shards: int | None,
             removed: tuple[int, ...] = ()) -> None:
        """The action ``command`` ended (``ok`` or not); ``num_shards``: shards holding blocks now."""
        if num_shards is not None:
            self.num_shards = num_shards
        if isinstance(command, ChangePlacement):
            self.placements.pop(0)
            if ok:
                for key in command.new_keys:
                    self.kernel.add(self.spec, now, key=key)  # type: ignore[arg-type]
                self._reorder(command.decisions, command.new_keys)
            for key in removed:
                self.kernel.remove(key)
            return
        if not ok:
            return  # a destination died meanwhile: the notice's deadline (or the next pass) decides
        if isinstance(command, Restore):
            for dead, spare in command.replacements:
                self.order[self.index_of(dead)] = spare
                self._join(spare, now)
            self.dead.clear()
            self.restore_reason = None
        elif isinstance(command, EvacuatePs):
            spare = () if command.spare is None else (command.spare,)
            self._reorder(command.moves or (*(AddShard() for _ in spare), RemoveShard(self.index_of(command.key))),
                          spare)
            self.evacuations.pop(command.key, None)
            self.kernel.remove(command.key)
            self.evacuated += 1
            if command.spare is not None:
                self._join(command.spare, now)
        elif isinstance(command, ParkPs):
            self.evacuations.pop(command.key, None)
            self.kernel.remove(command.key)
            self.parked[command.key] = command.deadline
        elif isinstance(command, UnparkPs):
            self.order[self.index_of(command.key)] = command.spare
            self.parked.pop(command.key, None)
            self.evacuated += 1
            self._join(command.spare, now)
        elif isinstance(command, FillPs):
            self._reorder(command.moves or (AddShard(),), (command.spare,))
            self._join(command.spare, now)

    def _join(self, key: int, now: float) -> None:
        """A spare holds blocks now: it is one of the run's PS servers (its lifetime counts from now)."""
        self.spares.pop(key, None)
        self.kernel.add(self.spec, now, key=key)  # type: ignore[arg-type]

    # -- time -------------------------------------------------------------------------------------
    def unanswered(self) -> bool:
        """Whether a replacement PS server was asked for and its start not answered yet."""
        return any(not s.heard for s in self.spares.values())

    def next_time(self, now: float) -> float:
        """The next cloud time after ``now`` something is due for the PS servers (inf: nothing)."""
        lead = self.kernel.notice_s
        times = [at - lead for key, at in self.kernel.deadlines.items() if key not in self.kernel.noticed]
        times += list(self.kernel.noticed.values())
        times += [s.ready_at for s in self.spares.values() if s.ready_at is not None]
        times += [self._park_at(k, d) for k, d in self.evacuations.items() if d.onto == Destination.REPLACEMENT]
        return min((t for t in times if t > now), default=math.inf)
