"""Spot parameter servers, one command line trained and simulated: evacuations, fills, parking (issue 43).

The emulated Ray run of each line and the first run of its simulation take the same decisions, with the same
arguments, at the same global steps (``assert_trained_as_simulated``, as the lines of
``tests/train/test_cross_driver.py``). A replacement PS joins at the step its emulated start-up ends in both: the
trainer holds training there until its process is up. Each run gets a local Ray of its own: run after the module
cluster of ``test_cross_driver.py`` (a 3-CPU head), the evacuate-and-fill line held at step 2 for minutes, its second
replacement PS's process not up (not yet understood; the run would have ended at the 300 s start time-out).
"""

from __future__ import annotations

import pytest
from test_cross_driver import assert_trained_as_simulated

from cmdare.train.cli.train_cmd import DEFAULT_REVOCATIONS


@pytest.mark.cluster  # make test-cluster: two emulated runs against their simulations
@pytest.mark.parametrize("line", [
    # PS notices with time to evacuate: the blocks move to the survivor, a replacement PS fills at the step its
    # emulated start-up ends
    {"transient": True, "ps_transient": True, "ps": 2, "checkpoint_every": 50,
     "revocations": DEFAULT_REVOCATIONS + ",notice=5"},
    # the last shard noticed at cloud second 2 with a 4 s lead, its replacement's start-up longer: it parks until
    # the replacement is up, then unparks onto it
    {"ps_transient": True, "ps": 1, "steps": 700, "checkpoint_every": 100,
     "revocations": "trace=2@ps,notice=4,step=0.02"},
], ids=["evacuate-and-fill", "park-and-unpark"])
def test_spot_parameter_servers_trained_and_simulated_take_the_same_decisions(line, tmp_path):
    assert_trained_as_simulated(line, tmp_path)
