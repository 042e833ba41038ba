"""The Ray driver of an all-reduce run: the members' chunks and faults in, the controller's commands carried out.

The loop and the workers' commands are every driver's (:class:`~cmdare.train.run.driver_loop.DriverLoop`); this
adds the group's. Members train in lockstep: each gets one chunk at a time, every chunk of a round stops at the
same step, and once every member is back from a round the next round goes on for all of them or for none (a
hold, a fence reached, a member's preemption notice). A noticed member trains to the end of its round and says
so then: the group stops at that step, where the controller re-forms it without the member, nothing lost.
``Regroup`` forms the group of the command's epoch on every member and heals their state from the root member, or
loads the checkpoint the controller names into all of them.

A member whose collective failed (a peer died, froze or left) drops the step in flight and comes back with the
loss; the driver then asks every member of the group whether it lives (within the group's deadline: a member
waiting in a collective still answers), reports those that do not as failed, and, if all answer, reports the
group broken, so that the controller forms it again. Nothing is decided here.
"""

from __future__ import annotations

import time
from typing import Any

from cmdare.collective import Rendezvous
from cmdare.control import RunController
from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.allreduce_topology import AllReduceTopology
from cmdare.control.kinds import ShardAction
from cmdare.storage import Storage
from cmdare.train.allreduce.group_duties import GroupDuties
from cmdare.train.allreduce.member_executor import MemberExecutor
from cmdare.train.allreduce.replica import MemberChunk
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore
from cmdare.train.run.driver_loop import DriverLoop
from cmdare.train.run.run_metrics import RunMetrics
from cmdare.train.runtime.cluster_health import probe_actors
from cmdare.train.runtime.detached import DetachedCalls
from cmdare.train.runtime.emitter import RunEmitter
from cmdare.train.spec import TrainSpec

__all__ = ["FORM_TIMEOUT_S", "AllReduceDriver"]

FORM_TIMEOUT_S = 60.0  # the most forming a group and healing its state may take before the members count as lost


class AllReduceDriver(DriverLoop):
    """Carries out one all-reduce run's controller on Ray (``rendezvous``: where its members meet)."""

    topology_class = AllReduceTopology

    def __init__(self, controller: RunController, spec: TrainSpec, storage: Storage, workers: MemberExecutor,
                 duties: GroupDuties, emitter: RunEmitter, metrics: RunMetrics, detached: DetachedCalls,
                 initial: Checkpoint, real: bool, rendezvous: Rendezvous):
        super().__init__(controller, spec, storage, workers, duties, emitter, metrics, detached, initial, real)
        self.members: MemberExecutor = workers
        self.rendezvous = rendezvous
        self.epoch = 0  # the group formed last
        self._probed = -1  # the epoch whose loss was probed already
        self._back: dict[int, tuple[int, bool]] = {}  # members back from the round: (their step, whether to go on)
        self._noticed: set[int] = set()  # members whose notice was reported
        self._broken = False  # a member's actor died in this round: it does not go on

    @property
    def _probe_timeout_s(self) -> float:  # type: ignore[override]
        """A member waiting in a collective answers at once: only a frozen one takes this long."""
        return 2 * self.members.deadline_s

    # -- chunks ---------------------------------------------------------------------------------------
    def _feed(self, wid: int) -> None:
        """One chunk on member ``wid``, stopping at the fence (every member of the round gets the same)."""
        if self.queued[wid]:
            return
        w = self.members.workers[wid]
        ref = w.actor.run_steps.remote(self.spec.chunk_steps, self.fence)
        self.inflight[ref] = wid
        self.queued[wid] += 1

    def _chunk_result(self, wid: int, w: Any, res: MemberChunk, wall: float) -> None:
        self.global_step = max(self.global_step, res.step)
        if w is None:
            return
        self._record_chunk(w, res.steps, res.duration_s, res.loss)
        done = res.step >= self.fence
        diverged = res.diverged_at is not None  # amp-fp16: an overflow at the smallest loss scale
        events: list[E.Event] = [E.ChunkDone(wall=wall, worker_id=wid, global_step=res.step, steps=res.steps,
                                             refused=done, loss=res.loss if res.steps or diverged else None,
                                             duration_s=res.duration_s, diverged_at=res.diverged_at)]
        if res.overflow_skips:  # amp-fp16: the group skipped steps whose averaged gradient overflowed
            self.emitter.event("loss_scale_overflow", worker_id=wid,
                               details={"skipped": res.overflow_skips, "loss_scale": res.loss_scale})
        if res.notice is not None and wid not in self._noticed and w.revoked_at is None:
            self._noticed.add(wid)
            self.members.notice(w, res.notice)
            events.append(E.WorkerNotice(wall=wall, worker_id=wid, provider=str(res.notice.get("provider")),
                                         deadline=res.notice.get("deadline") if self.real else None))
        if res.lost is not None:
            events += self._group_lost(wid, res.lost, wall)
        self._back[wid] = (res.step, res.lost is None and wid in self.feeding and not done and
                           wid not in self._noticed)
        self._event(*map(self._stamp, events))

    def _chunk_back(self, ref: Any, wall: float) -> None:
        super()._chunk_back(ref, wall)
        if self._back and not any(self.queued[m] for m in self.feeding | set(self._back)):
            self._event(*map(self._stamp, self._end_round(wall)))

    def _end_round(self, wall: float) -> list[E.Event]:
        """Every member is back from the round (or gone): the next round goes on for all of them, or for none (a
        member lost or noticed, a hold, the fence)."""
        back, self._back = self._back, {}
        step = max(s for s, _ in back.values())
        go = all(on for _, on in back.values()) and step < self.fence and not self._broken
        self._broken = False
        events: list[E.Event] = []
        for wid in sorted(back):
            if go:
                self._feed(wid)
            else:
                self.feeding.discard(wid)
                events.append(E.WorkerStopped(wall=wall, worker_id=wid, global_step=back[wid][0]))
        return events

    def _actor_failed(self, wid: int, err: Exception, wall: float) -> list[E.Event]:
        self._broken = True
        return super()._actor_failed(wid, err, wall)

    def _do_HoldAll(self, cmd: C.HoldAll) -> list[E.Event]:
        events = super()._do_HoldAll(cmd)
        for ev in events:  # stopped, and said so: out of the round
            self._back.pop(ev.worker_id, None)
        return events

    def _group_lost(self, wid: int, detail: str, wall: float) -> list[E.Event]:
        """Member ``wid``'s collective failed: which members are gone? (once per group)"""
        if self._probed == self.epoch:
            return []
        self._probed = self.epoch
        self.emitter.event("collective_failed", worker_id=wid, details={"epoch": self.epoch, "error": detail})
        actors = {m: w.actor for m, w in self.members.workers.items() if w.is_up and w.revoked_at is None}
        failed, pending = probe_actors(actors, self.members.deadline_s)
        self.detached.add(*pending)
        if not failed:
            return [E.GroupBroken(wall=wall, worker_id=wid, detail=detail)]
        return [E.ChunkFailed(wall=wall, worker_id=m, error=f"lost from the all-reduce group ({why})")
                for m, why in failed.items()]

    # -- commands: training ---------------------------------------------------------------------------
    def _do_Fence(self, cmd: C.Fence) -> None:
        self.fence = cmd.step

    def _do_Train(self, cmd: C.Train) -> None:
        if cmd.worker_id not in self.members.workers:
            return
        self.feeding.add(cmd.worker_id)
        self._feed(cmd.worker_id)

    def _do_SetRoundSize(self, cmd: C.SetRoundSize) -> None:
        """A group's size is the members it is formed of (:meth:`_do_Regroup`): nothing to tell anyone."""

    def _do_StartDuty(self, cmd: C.StartDuty) -> list[E.Event]:
        return self.duties.start(cmd, self.members.workers.get(cmd.worker_id), time.time())

    def _do_Regroup(self, cmd: C.Regroup) -> list[E.Event]:
        """Form the group of ``cmd.epoch`` on its members, then heal their state from the root, or load the
        checkpoint named into every one of them (no member of the old group left, or training diverged). A
        resumed run's first group loads the checkpoint it resumed from."""
        t0 = time.time()
        members = [self.members.workers[m] for m in cmd.members if m in self.members.workers]
        if len(members) < len(cmd.members):  # a member went while the command was on its way
            return [E.ActionDone(wall=time.time(), action=ShardAction.REGROUP, ok=False)]
        first, self.epoch = self.epoch == 0, cmd.epoch
        self._back.clear()  # the rounds of the old group are over
        self._broken = False
        n = len(members)
        failed = self._wait_all({w.worker_id: w.actor.form.remote(cmd.epoch, rank, n, self.members.lr_scale)
                                 for rank, w in enumerate(members)})
        action = ShardAction.REGROUP if cmd.root is not None else ShardAction.RESTORE
        load = None if cmd.root is not None and not (first and self.initial.step > 0) else \
            self.initial if cmd.checkpoint is None else CheckpointStore(self.storage).load_step(cmd.checkpoint)
        step: int | None = None
        if not failed and load is None:
            root = cmd.members.index(cmd.root)
            failed = self._wait_all({w.worker_id: w.actor.heal.remote(root) for w in members})
            step = self._root_step(members[root])
        elif not failed and load is not None:
            state = _checkpoint_state(load)
            failed = self._wait_all({w.worker_id: w.actor.restore.remote(state) for w in members}, truthy=False)
            step = load.step
        if failed:
            self.emitter.event("regroup_failed", details={"epoch": cmd.epoch, "members": list(cmd.members),
                                                          "failed": dict(failed)})
            lost: list[E.Event] = [E.ChunkFailed(wall=time.time(), worker_id=m, error=f"left the group ({why})")
                                   for m, why in failed.items() if why != "not formed"]
            return [*lost, E.ActionDone(wall=time.time(), action=action, ok=False)]
        if step is not None and action == ShardAction.RESTORE:  # the controller's fence goes back with it
            self.global_step = self.fence = step
        elif step is not None:
            self.global_step = max(self.global_step, step)
        self.emitter.event("regroup", details={
            "epoch": cmd.epoch, "members": list(cmd.members), "root": cmd.root, "checkpoint": cmd.checkpoint,
            "step": step, "duration_s": time.time() - t0, "reason": cmd.reason, "why": cmd.why,
            "from_checkpoint": load is not None})
        return [E.ActionDone(wall=time.time(), action=action, ok=True, step=step)]

    def _root_step(self, root: Any) -> int | None:
        """The step the healed group is at (the root's)."""
        import ray

        try:
            return int(ray.get(root.actor.position.remote(), timeout=FORM_TIMEOUT_S)[0])
        except (ray.exceptions.RayError, TimeoutError):
            return None

    def _wait_all(self, calls: dict[int, Any], truthy: bool = True) -> dict[int, str]:
        """Wait for one call per member (at most :data:`FORM_TIMEOUT_S`); the members whose call failed, with why
        (``"not formed"``: it answered False, a peer did not come; only when ``truthy``)."""
        import ray

        ready, pending = ray.wait(list(calls.values()), num_returns=len(calls), timeout=FORM_TIMEOUT_S)
        by_ref = {ref: m for m, ref in calls.items()}
        failed = {by_ref[ref]: "unresponsive" for ref in pending}
        self.detached.add(*pending)
        for ref in ready:
            try:
                if not ray.get(ref) and truthy:
                    failed.setdefault(by_ref[ref], "not formed")
            except ray.exceptions.RayError as err:
                failed[by_ref[ref]] = type(err).__name__
        return failed

    # -- commands: the run ----------------------------------------------------------------------------
    def _no_servers(self, cmd: C.Command) -> None:
        raise TypeError(f"an all-reduce run has no parameter servers: {type(cmd).__name__} is not carried out here")

    _do_StartPs = _do_PsNoticed = _do_EvacuatePs = _do_ParkPs = _do_UnparkPs = _do_FillPs = _do_KillPs = \
        _do_Restore = _do_ChangePlacement = _do_Balance = _no_servers


def _checkpoint_state(ckpt: Checkpoint) -> Any:
    """A checkpoint as :meth:`~cmdare.train.allreduce.replica.Replica.restore` takes it, put in Ray's store once
    (every member reads the same copy)."""
    import ray

    where = (ckpt.meta or {}).get("data_position")
    return ray.put({"step": ckpt.step, "params": ckpt.params, "momentum": ckpt.momentum, "buffers": ckpt.buffers,
                    "optimizer": ckpt.optimizer, "where": tuple(where) if where else None})
