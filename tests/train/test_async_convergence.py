"""Asynchronous defaults converge where plain SGD does (issue 42): a user's 2-layer regression at the default lr 0.05
and momentum 0.9 exploded to a loss of 7.5e15 with 2 asynchronous workers; asynchrony adds momentum of its own
(Mitliagkas et al., 2016), so the shards apply the momentum reduced by it (``--async-momentum compensate``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cmdare.ps.optimizer_config import OptimizerConfig, async_momentum
from cmdare.train import TrainSpec

PROJECT = Path(__file__).parent / "user_regression"
CMDARE = str(Path(sys.executable).parent / "cmdare")
UNTRAINED_MSE = 2.36  # the regression's test MSE before training (plain torch.optim.SGD reaches about 0.1 in 300 steps)


def test_the_momentum_asynchrony_adds_is_taken_off_the_shards_momentum():
    assert async_momentum(0.9, 1) == 0.9
    assert async_momentum(0.9, 2) == pytest.approx(0.4)
    assert async_momentum(0.9, 4) == pytest.approx(0.15)
    assert async_momentum(0.9, 16) == 0.0
    spec = TrainSpec(workers=4, optimizer=OptimizerConfig(lr=0.05, momentum=0.9, nesterov=True))
    assert spec.shard_optimizer().momentum == pytest.approx(0.15) and spec.shard_optimizer().nesterov
    assert TrainSpec(workers=16, optimizer=OptimizerConfig(momentum=0.9, nesterov=True)).shard_optimizer() \
        == OptimizerConfig(momentum=0.0, nesterov=False)
    for unchanged in (TrainSpec(workers=4, sync=True), TrainSpec(workers=4, async_momentum="keep"),
                      TrainSpec(workers=1)):
        assert unchanged.shard_optimizer() == unchanged.optimizer


@pytest.mark.cluster  # three end-to-end runs under the default revocations: the long tier
@pytest.mark.parametrize("workers", [2, 4])
def test_a_users_regression_converges_with_asynchronous_workers_and_revocations(tmp_path, workers):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT), COLUMNS="200")
    res = subprocess.run([CMDARE, "train", "--model", "userreg:build", "--dataset", "userreg:data", "--loss",
                          "userreg:loss", "--workers", str(workers), "--ps", "1", "--steps", "300", "--transient"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "momentum 0.9 applied as" in res.stderr
    mse = float(re.search(r"finished: step 300 .* test loss ([0-9.e+-]+)", res.stdout).group(1))
    assert mse < 0.2 * UNTRAINED_MSE, res.stdout


@pytest.mark.cluster  # an end-to-end run through the CLI
def test_a_loss_nan_from_the_first_step_says_where_it_rolled_back_to_and_that_nothing_can_be_resumed(tmp_path):
    """It printed 'shards restored from the newest checkpoint' and 'rolled back to step 0' with none stored, put
    the NaN 'at step 50', and ended with 'resume with --resume RUN', which answered 'no checkpoint to resume'."""
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT), COLUMNS="200")
    res = subprocess.run([CMDARE, "train", "--model", "userreg:build", "--dataset", "userreg:data", "--loss",
                          "userreg:nan_loss", "--workers", "2", "--steps", "100", "--on-diverge", "rollback:2"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: training diverged")]
    assert len(warnings) == 2 and all("loss is nan at step 0)" in w for w in warnings), warnings
    assert all("rolled back to the start of the run (step 0: no checkpoint was stored yet)" in w for w in warnings)
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("error: training diverged again after 2 rollback(s): worker ") and \
        "loss is nan at step 0 " in error and error.endswith("there is nothing to resume: start the run again"), error
