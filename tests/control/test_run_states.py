"""The run's state machine, without Ray: the transitions the coordinator's docstring draws, and only those."""

from __future__ import annotations

import pytest

from cmdare.control.run_state import TRANSITIONS, RunState, RunStateMachine


def test_a_run_through_losses_and_a_restore():
    m = RunStateMachine()
    path = [RunState.RUNNING, RunState.DEGRADED, RunState.RUNNING, RunState.RESTORING, RunState.DEGRADED,
            RunState.FINISHING, RunState.FINISHED]
    for state in path:
        assert m.to(state)
    assert [s for _, s in m.history] == [RunState.STARTING, *path] and m.done
    assert not m.to(RunState.FINISHED)  # staying put is no transition


@pytest.mark.parametrize("start, bad", [
    (RunState.STARTING, RunState.DEGRADED),  # degraded only after training started
    (RunState.STARTING, RunState.FINISHING),
    (RunState.FINISHING, RunState.RUNNING),  # no way back from the final duties
    (RunState.FINISHED, RunState.FAILED),  # an ended run stays ended
    (RunState.FAILED, RunState.RUNNING),
])
def test_transitions_not_drawn_are_refused(start, bad):
    m = RunStateMachine()
    m.state = start
    with pytest.raises(RuntimeError, match=f"cannot move to {bad}"):
        m.to(bad)


def test_every_live_state_can_fail_or_be_interrupted():
    for state, targets in TRANSITIONS.items():
        if targets:
            assert {RunState.FAILED, RunState.INTERRUPTED} <= targets, state
    assert {s for s, t in TRANSITIONS.items() if not t} == {RunState.FINISHED, RunState.FAILED, RunState.INTERRUPTED}
