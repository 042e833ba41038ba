"""The topology seam: what the fleet asks of the way a run trains.

The run controller (:mod:`cmdare.control.controller`) is the *fleet*: servers, lifetimes, notices,
replacements, liveness, duties, the chief, the learning rate and the run's end. How the members train together
(through parameter-server shards, :class:`~cmdare.control.ps_topology.PsTopology`, or as an elastic all-reduce
group, :class:`~cmdare.control.allreduce_topology.AllReduceTopology`) is a
:class:`Topology` the fleet consults: the step rate of a membership, whether training must hold for an action on
quiesced state, what a join or a loss means for training, and whether duty state can be taken now. A topology's
own events (for a PS: its servers' notices, start-ups and deaths, placement requests) are dispatched to its
``_on_<Event>`` handlers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cmdare.cloud.servers import ServerSpec
    from cmdare.control.run_commands import Command
    from cmdare.control.run_events import ActionDone, ChunkDone
    from cmdare.control.worker_control import WorkerControl

__all__ = ["Quiesce", "Topology"]


@dataclass(frozen=True)
class Quiesce:
    """Training must hold now.

    Attributes:
        why: what it holds for (named in the ``HoldAll`` command).
        action: once every worker stopped, an action on the quiesced state, answered by ``ActionDone``.
        then: once every worker stopped, a command carried out at once, after which training goes on.
    """

    why: str
    action: Command | None = None
    then: Command | None = None


class Topology(Protocol):
    """How the members of a run train together, as the fleet sees it (the controller's seam)."""

    #: Members train in lockstep rounds: a round is never cut in two and starts with all its members.
    lockstep: bool
    #: Why the run cannot go on (set by the topology; None while it can).
    failure: str | None

    def start(self, spec: ServerSpec, count: int, now: float, step: int) -> None:
        """Training starts at ``step``: the topology's own servers (``count`` of ``spec``; a PS: its shards)."""

    def snapshot(self) -> dict[str, Any] | None:
        """The topology's emulated servers (their ready times and drawn lifetimes), as JSON-able values saved with
        a checkpoint (None: nothing a resumed run can go on with)."""

    def resume(self, saved: dict[str, Any] | None) -> None:
        """After :meth:`start` of a resumed run: its servers are the saved run's (:meth:`snapshot`), where they fit
        (else they stay as started)."""

    def at(self, now: float, wall: float) -> None:
        """The time of the event being handled (cloud ``now`` and the driver's ``wall``)."""

    def rate(self, workers: WorkerControl) -> float:
        """Steps per cloud second of the membership as it is (emulation and the simulator)."""

    # -- the topology's servers, as fleet members with lifetimes --------------------------------------
    def candidates(self) -> list:
        """The topology's servers a periodic or scripted revocation source may pick now."""

    def tick(self, now: float, picked: Sequence[int], due_by: float) -> None:
        """Cloud events of the topology's servers due by ``due_by``; ``picked``: the source's picks among them."""

    def expire(self, wall: float) -> None:
        """Deadlines on the topology's real waits (a server not up in time) at ``wall``."""

    def next_time(self, now: float) -> float:
        """The next cloud time after ``now`` something is due for the topology (inf: nothing)."""

    def next_wall(self) -> float:
        """The next wall time a real wait of the topology's times out (inf: none)."""

    def unanswered(self) -> bool:
        """Whether a server of the topology was asked for and its start not answered yet (``ServerStarting``)."""

    def ready_times(self) -> list[float | None]:
        """When what the topology waits for is ready (cloud time; None: not known yet)."""

    def server_starting(self, key: int, startup_s: float | None, now: float) -> None:
        """One of the topology's servers is starting; up ``startup_s`` after ``now`` (None: not known)."""

    # -- training ----------------------------------------------------------------------------------
    def blocked(self, now: float) -> bool:
        """Whether training and duties must wait (the training state cannot be taken now)."""

    @property
    def restoring(self) -> bool:
        """Whether training state was lost and is being restored (the run's state is RESTORING)."""

    def quiesce(self, now: float, workers: WorkerControl, quiesced: bool) -> Quiesce | None:
        """Whether training must hold now, and (once every worker stopped: ``quiesced``) what to do then."""

    def action_done(self, command: Command, ev: ActionDone) -> None:
        """The action ``command`` on quiesced state ended (``ev.ok``)."""

    def membership(self, workers: WorkerControl) -> None:
        """The membership may have changed (a pass, a loss): what that means for training now."""

    def balance(self, step: int) -> Command | None:
        """A command that asks for the state's balance to be checked at ``step``, if one is due."""

    def chunk_done(self, ev: ChunkDone) -> None:
        """A chunk of training ended (its steps and times)."""

    def roll_back(self, reason: str) -> None:
        """Every member goes back to the newest stored checkpoint (training diverged)."""

    @property
    def rolling_back(self) -> bool:
        """Whether a rollback after a divergence is on its way."""

    def state_lost(self) -> None:
        """A duty found training state gone (a server of the topology died): restore it."""
