"""`--startup` (emulated start-up of a replacement): 'model' or seconds from 0 to a day (issue 42, item 11: `train
--startup -5` was accepted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmdare.errors import UserInputError
from cmdare.train.spec import TrainSpec

CMDARE = str(Path(sys.executable).parent / "cmdare")


@pytest.mark.parametrize("value", ["-5", "-0.1", "nan", "inf", "1e308", "soon", "", "86401"])
def test_a_startup_that_is_not_model_or_seconds_is_refused(value):
    with pytest.raises(UserInputError, match="--startup must be 'model' or seconds from 0 to 86400") as err:
        TrainSpec(model="resnet8", startup=value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["model", "0", "12.5", "86400"])
def test_model_and_seconds_are_taken(value):
    assert TrainSpec(model="resnet8", startup=value).startup == value


def test_the_cli_refuses_a_negative_startup_in_one_line(tmp_path):
    res = subprocess.run([CMDARE, "train", "--no-record", "--startup", "-5", "--steps", "5"], capture_output=True,
                         text=True, env=dict(os.environ, CMDARE_HOME=str(tmp_path)), timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: --startup must be 'model' or seconds"), res.stderr
