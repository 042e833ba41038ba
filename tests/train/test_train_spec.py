"""Run options refused before anything starts: non-finite numbers, storage that ends with the process."""

from __future__ import annotations

import pytest

from cmdare.errors import UserInputError
from cmdare.train.spec import TrainSpec


@pytest.mark.parametrize("field", ["lr", "momentum", "weight_decay", "decay_factor"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_optimizer_options_are_refused(field, value):
    from cmdare.ps.optimizer import OptimizerConfig

    with pytest.raises(UserInputError, match=f"--{field.replace('_', '-')} must be a finite number"):
        OptimizerConfig(**{field: value})


@pytest.mark.parametrize("field", ["chunk_s", "cpus_per_worker", "cpus_per_shard", "replacement_timeout_s"])
def test_nan_run_options_are_refused(field):
    with pytest.raises(UserInputError, match="must be a number, got nan"):
        TrainSpec(**{field: float("nan")})


def test_storage_that_ends_with_the_process_is_refused_for_checkpoints():
    from cmdare.train.run.run_start import training_storage

    with pytest.raises(UserInputError, match="vanish"):
        training_storage(TrainSpec(storage="memory://ckpt"), "run-1", None)


def test_failed_uploads_are_shown_as_they_happen_first_with_the_error_then_a_count(capsys):
    from cmdare.events import EventReport
    from cmdare.train.cli.train_cmd import RunNotices

    notices = RunNotices()
    for step in (50, 100, 150):
        notices.on_event(EventReport("r", 0.0, "checkpoint_failed", details={"step": step, "error": "disk [full]"}))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: the checkpoint of step 50 could not be stored (disk [full]); training goes on, the previous "
        "checkpoints stay valid",
        "warning: the checkpoint of step 100 could not be stored either (2 failed so far)",
        "warning: the checkpoint of step 150 could not be stored either (3 failed so far)",
    ]


def test_more_shards_than_parameter_blocks_is_refused(tmp_path):
    """Issue 29: --ps 24 on a 23-tensor model billed a shard that held nothing."""
    from cmdare.storage import Storage
    from cmdare.train.run.run_start import initial_state

    assert len(initial_state(TrainSpec(model="resnet8", ps=23), "r", Storage(tmp_path), None, False)[0]) == 23
    with pytest.raises(UserInputError, match="--ps 24: resnet8 has 23 parameter blocks and placement round-robin "
                                             "leaves 1 shard"):
        initial_state(TrainSpec(model="resnet8", ps=24), "r", Storage(tmp_path), None, False)


@pytest.mark.parametrize("first, step, speed, wall", [(0, 150, 18.5, 28.4), (400, 700, 50.0, 20.0), (0, 0, 0.0, 3.0)])
def test_the_summary_speed_line_divides_out(first, step, speed, wall):
    """Issue 30: '150 steps, 18.5 steps/s over 28.4 s' did not divide out (the speed leaves start-up out), nor
    did a resumed run's (its steps counted from 0)."""
    import re

    from cmdare.events import RunSummary
    from cmdare.train.cli.train_cmd import speed_line

    line = speed_line(RunSummary("r", 0.0, "finished", step, wall, speed, None, None,
                                 details={"resumed_from_step": first}))
    steps, rate, train_s, rest = map(float, re.search(
        r"training: (\d+) steps.* at ([\d.]+) steps/s = ([\d.]+) s; start-up, checkpoints and the end ([\d.]+) s",
        line).groups())
    assert steps == step - first and (f"(from step {first})" in line) == bool(first)
    assert abs(steps / rate - train_s) < 0.06 if rate else train_s == 0
    assert abs(train_s + rest - wall) < 0.11
