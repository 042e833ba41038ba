"""The Ray executor of an all-reduce run's chief duties: checkpoints and evaluations of the group's state.

Every member holds the same state, so the chief's is the group's: a checkpoint is the chief's parameters, SGD
momentum, buffers and any other optimizer state (:meth:`~cmdare.train.allreduce.replica.Replica.checkpoint`),
stored in the run's storage in the background exactly as a parameter-server run's (the same
:class:`~cmdare.train.duties.checkpoint.Checkpoint` format, so either topology resumes the other's with SGD); an
evaluation runs the chief's model. The controller starts a duty at a barrier, every member stopped at its step.
"""

from __future__ import annotations

import time
from typing import Any

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.kinds import DutyKind
from cmdare.ps.blocks import ParamInfo
from cmdare.train.duties.checkpoint import Checkpoint
from cmdare.train.duties.checkpoint_uploads import CheckpointUploads
from cmdare.train.duties.chief_duties import ChiefDuties
from cmdare.train.runtime.emitter import RunEmitter

__all__ = ["GroupDuties"]


class GroupDuties(ChiefDuties):
    """Starts the chief member's duties, records their results, stores the checkpoints."""

    def __init__(self, uploads: CheckpointUploads, meta: dict[str, Any], infos: list[ParamInfo],
                 emitter: RunEmitter):
        super().__init__(uploads, meta, infos, emitter, None)

    def start(self, cmd: C.StartDuty, chief: Any, wall: float) -> list[E.Event]:
        """Start the duty on the chief member (its state is the group's: every member stopped at the step)."""
        if chief is None:
            return [E.DutyDone(wall=wall, kind=cmd.kind, worker_id=cmd.worker_id, step=cmd.step, ok=False)]
        ref = chief.actor.checkpoint.remote() if cmd.kind == DutyKind.CHECKPOINT else chief.actor.evaluate.remote()
        self.refs[ref] = (cmd, time.time())
        return []

    def _checkpoint(self, cmd: C.StartDuty, state: Any, meta: dict[str, Any]) -> tuple[Checkpoint, float]:
        """The chief's state as a checkpoint (its data position in the metadata); nothing stalls but the duty."""
        meta = dict(meta, data_position=list(state["where"]))
        return Checkpoint(int(state["step"]), state["params"], state["momentum"], state["buffers"], meta,
                          state["optimizer"]), 0.0
