"""Exhaustive dispatch (issue 43): the controller takes every kind of event and every driver carries out every kind
of command; a new kind that one of them does not handle fails here, and the object refuses to be built."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from fake_driver import FakeDriver

from cmdare.control import run_commands as C
from cmdare.control import run_events as E
from cmdare.control.controller import RunController
from cmdare.control.dispatch import handler_table, kinds, missing_handlers
from cmdare.control.ps_topology import PsTopology
from cmdare.plan.sim_driver import SimRun
from cmdare.train.allreduce.allreduce_driver import AllReduceDriver
from cmdare.train.run.ray_driver import RayDriver


def test_the_controller_takes_every_kind_of_event():
    """The fleet's events by the controller, the parameter server's by its topology (issue 43's seam)."""
    assert len(kinds(E.Event)) >= 20
    assert missing_handlers((RunController, PsTopology), "_on_", E.Event) == []
    topology_only = missing_handlers(RunController, "_on_", E.Event)
    assert set(topology_only) == {"_on_PsNotice", "_on_PsUp", "_on_PsStartFailed", "_on_ShardLost", "_on_GroupBroken",
                                  "_on_PlacementRequested", "_on_ShardLoads"}


@pytest.mark.parametrize("driver", [RayDriver, AllReduceDriver, SimRun, FakeDriver], ids=lambda d: d.__name__)
def test_every_driver_carries_out_every_kind_of_command(driver):
    assert len(kinds(C.Command)) >= 25
    assert missing_handlers(driver, "_do_", C.Command) == []


def test_a_new_kind_nobody_handles_is_refused_when_the_handler_table_is_built():
    class Owner:
        def _do_Fence(self, c):
            return c

    @dataclass(frozen=True)
    class Base:
        pass

    @dataclass(frozen=True)
    class Fence(Base):
        step: int

    @dataclass(frozen=True)
    class Brand(Base):  # a new kind of command, no handler yet
        pass

    with pytest.raises(TypeError, match="Owner handles no _do_Brand"):
        handler_table(Owner(), "_do_", Base)
    assert missing_handlers(Owner, "_do_", Base) == ["_do_Brand"]

    class Complete(Owner):
        def _do_Brand(self, c):
            return "brand"

    table = handler_table(Complete(), "_do_", Base)
    assert set(table) == {Fence, Brand} and table[Fence](Fence(3)) == Fence(3) and table[Brand](Brand()) == "brand"


def test_one_builder_says_what_each_driver_means_for_the_run_config():
    """The trainer (real or emulated) and the simulator build their RunConfig with one function (issue 43)."""
    import math

    from cmdare.control.run_config import PARK_MARGIN_S, run_config_for

    real = run_config_for("real", steps=100, workers=2, replacement_timeout_s=600.0, sync=True)
    emulated = run_config_for("emulated", steps=100, workers=2, replacement_timeout_s=600.0, sync=True)
    simulated = run_config_for("simulated", steps=100, workers=2, replacement_timeout_s=600.0, sync=True)
    assert real.sync and emulated.sync and simulated.sync  # the run's own options, whoever drives it
    assert (real.admit_on_up, real.trained_on_join, real.park_margin_s, real.replacement_timeout_s) == \
        (True, False, PARK_MARGIN_S, 600.0)
    assert (emulated.admit_on_up, emulated.trained_on_join, emulated.replacement_timeout_s) == (False, True, None)
    assert simulated.virtual_duties and not emulated.virtual_duties and simulated.replacement_timeout_s == 600.0
    assert math.isinf(simulated.start_timeout_s) and math.isinf(simulated.probe_after_s)
    with pytest.raises(ValueError, match="one of"):
        run_config_for("local", steps=1, workers=1)
