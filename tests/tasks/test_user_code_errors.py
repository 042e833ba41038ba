"""Every mistake in user code, at any step, is one line naming the part and the step (issue 42): at the one-batch
check before anything starts (which now runs the backward pass too), in a worker's training step (through
``Task.step_loss`` and ``Task.backward``, which the worker calls), in an import or a factory that calls
``sys.exit`` or raises ``KeyboardInterrupt``; and a factory that never returns ends within a bound."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cmdare.errors import UserInputError
from cmdare.tasks import build_task

PROJECT = Path(__file__).parents[1] / "workloads" / "user_project"
CMDARE = str(Path(sys.executable).parent / "cmdare")
PARTS = {"model": "mypkg.tasks:build_regressor", "dataset": "mypkg.tasks:vectors", "loss": "mypkg.tasks:mse"}


@pytest.fixture(autouse=True)
def _user_project(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))


def _check(**parts: str) -> str:
    parts = {**PARTS, **parts}
    with pytest.raises(UserInputError) as err:
        build_task(parts["model"], parts["dataset"], loss=parts["loss"]).check(32, 2, 0)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(("parts", "message"), [
    ({"model": "mypkg.faults:build_frozen"}, "--model mypkg.faults:build_frozen: none of its parameters requires a "
                                             "gradient (requires_grad=False): there is nothing to train"),
    ({"loss": "mypkg.faults:constant_loss"}, "--loss mypkg.faults:constant_loss returned a loss with no gradient: "
                                             "it does not depend on the model's output"),
    ({"loss": "mypkg.faults:error_count"}, "--loss mypkg.faults:error_count returned a scalar of dtype int64, an "
                                           "integer tensor: a loss to train on is a floating-point tensor"),
    ({"dataset": "mypkg.faults:huge_set"}, "--dataset mypkg.faults:huge_set: its length 1,000,000,000,000 is too "
                                           "large to shuffle in memory (MemoryError: Unable to allocate 7.28 TiB"),
    ({"dataset": "mypkg.faults:ragged_set"}, "'s input has shape (16,), item "),
    ({"model": "mypkg.faults:build_exits"}, "--model mypkg.faults:build_exits: the factory called sys.exit(5) on "
                                            "node "),
    ({"model": "mypkg.faults:build_interrupted"}, "--model mypkg.faults:build_interrupted: the factory raised "
                                                  "KeyboardInterrupt on node "),
    ({"model": "mypkg.exits_at_import:build"}, "--model mypkg.exits_at_import:build: cannot import "
                                               "mypkg.exits_at_import on node "),
    ({"dataset": "mypkg.faults:wrong_test_set"}, "--model mypkg.tasks:build_regressor on the test data: the forward "
                                                 "pass failed (RuntimeError: mat1 and mat2 shapes cannot be"),
])
def test_the_check_says_each_mistake_in_one_line(parts, message):
    assert message in _check(**parts)


def test_the_ragged_items_are_named():
    text = _check(dataset="mypkg.faults:ragged_set")
    assert text.startswith("--dataset mypkg.faults:ragged_set: item ")
    assert "could not be collated into a batch (RuntimeError: stack expects each tensor to be equal size" in text


@pytest.mark.parametrize(("parts", "message"), [
    ({"dataset": "mypkg.faults:late_raising_set"}, "--dataset mypkg.faults:late_raising_set at step 5: item {} "
                                                   "raised ValueError: corrupt record {}"),
    ({"dataset": "mypkg.faults:late_none_set"}, "--dataset mypkg.faults:late_none_set at step 5: item {} is None, "
                                                "not an (input, target) pair"),
    ({"dataset": "mypkg.faults:late_ragged_set"}, "--dataset mypkg.faults:late_ragged_set at step 5: item {}'s input "
                                                  "has shape (9,), item {}'s (8,): items could not be collated"),
    ({"model": "mypkg.faults:build_late_failing"}, "--model mypkg.faults:build_late_failing at step 20: the forward "
                                                   "pass failed on a batch of the dataset (RuntimeError: the hidden "
                                                   "state went stale)"),
])
def test_a_mistake_after_the_check_is_one_line_naming_the_part_and_the_step(parts, message):
    """What the worker's training loop calls: ``loss = task.step_loss(model, stream, device, step)`` and
    ``task.backward(model, loss, step)``; the mistakes show after ``LATE`` items (or 20 forward passes)."""
    import re

    parts = {**PARTS, **parts}
    task = build_task(parts["model"], parts["dataset"], loss=parts["loss"])
    task.check(32, 2, 0)  # the driver's check passes: these show later
    model, stream = task.build(), task.stream(1, 2, 32, 0)
    with pytest.raises(UserInputError) as err:
        for step in range(100):
            task.backward(model, task.step_loss(model, stream, "cpu", step), step)
    pattern = re.escape(message).replace(re.escape("{}"), r"\d+")
    assert re.fullmatch(pattern + ".*", str(err.value)) and "\n" not in str(err.value), str(err.value)


@pytest.fixture()
def _forever_released():
    """The factories that never return end once the test is done (their helper threads would stay behind)."""
    from mypkg import faults

    faults.RELEASE.clear()
    yield
    faults.RELEASE.set()


def test_a_factory_that_never_returns_ends_within_the_bound(monkeypatch, _forever_released):
    monkeypatch.setenv("CMDARE_USER_CODE_TIMEOUT", "1.5")
    for parts, name in (({"model": "mypkg.faults:build_forever"}, "--model mypkg.faults:build_forever"),
                        ({"dataset": "mypkg.faults:data_forever"}, "--dataset mypkg.faults:data_forever")):
        t0 = time.monotonic()
        text = _check(**parts)
        assert time.monotonic() - t0 < 30
        assert text.startswith(f"{name}: the factory on node ") and "did not return within 1.5 s" in text
        assert "CMDARE_USER_CODE_TIMEOUT" in text
    monkeypatch.setenv("CMDARE_USER_CODE_TIMEOUT", "soon")
    assert "CMDARE_USER_CODE_TIMEOUT must be a positive number of seconds, got 'soon'" in _check()


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "mypkg.exits_at_import:build"], "cannot import mypkg.exits_at_import on node"),
    (["--model", "mypkg.faults:build_forever"], "the factory on node"),
])
def test_the_cli_ends_each_in_one_line_with_status_1(tmp_path, args, message):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT), CMDARE_USER_CODE_TIMEOUT="2")
    cmd = [CMDARE, "train", "--dataset", "mypkg.tasks:vectors", "--loss", "mypkg.tasks:mse", "--steps", "5", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], \
        (res.returncode, res.stderr)
