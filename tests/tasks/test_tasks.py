"""A task is the user's code (issue 33): the zoo on a built-in dataset and your own model, data, loss and metric
are one interface; the data are sharded deterministically; every mistake in your code is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cmdare.datasets import BatchStream, load_dataset
from cmdare.errors import UserInputError
from cmdare.tasks import build_task, part_name
from cmdare.train import TrainSpec

PROJECT = Path(__file__).parents[1] / "workloads" / "user_project"
CMDARE = str(Path(sys.executable).parent / "cmdare")


@pytest.fixture(autouse=True)
def _user_project(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))


def test_the_zoo_on_a_builtin_dataset_is_the_same_stream_as_before():
    task = build_task("resnet15", "digits")
    data = load_dataset("digits")
    for slot in (0, 1):
        ours, plain = task.stream(slot, 2, 32, 0, start_batch=5), BatchStream(data, slot, 2, 32, 0, start_batch=5)
        for _ in range(3):
            (x1, y1), (x2, y2) = next(ours), next(plain)
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    torch.manual_seed(0)
    result = task.evaluate(task.build(), "cpu", max_samples=100)
    assert 0 <= result.accuracy <= 1 and result.loss > 0 and set(result.metrics) == {"accuracy"}


def test_your_dataset_is_sharded_like_the_builtin_ones_and_resumes_in_the_same_order():
    from mypkg.tasks import vectors

    task = build_task("mypkg.tasks:build_regressor", "mypkg.tasks:vectors", loss="mypkg.tasks:mse",
                      metric="mypkg.tasks:mae")
    train, _ = vectors(0)
    plain = BatchStream((train.tensors[0], train.tensors[1]), 1, 2, 16, 3)  # the same permutation scheme
    stream = task.stream(1, 2, 16, 3)
    batches = [next(stream) for _ in range(20)]  # past one epoch (256 samples per slot: 16 batches)
    for x, y in batches:
        px, py = next(plain)
        assert torch.equal(x, px) and torch.equal(y, py)
    resumed = task.stream(1, 2, 16, 3, start_batch=13)
    for x, y in batches[13:]:
        rx, ry = next(resumed)
        assert torch.equal(x, rx) and torch.equal(y, ry)
    seen = torch.cat([x for x, _ in batches[:16]])  # one epoch of slot 1: distinct samples
    assert len({tuple(r.tolist()) for r in seen}) == 256
    torch.manual_seed(0)
    result = task.evaluate(task.build(), "cpu")
    assert result.accuracy is None and set(result.metrics) == {"mae"} and result.loss > 0


def test_objects_work_like_import_paths_and_are_recorded_by_name():
    from mypkg.tasks import build_regressor, mae, mse, vector_loader

    task = build_task(build_regressor, vector_loader, loss=mse, metric=mae)  # a DataLoader factory
    x, y = next(task.stream(0, 2, 16, 0))
    assert x.shape == (16, 8) and y.shape == (16,)  # cmdare's batch size, not the loader's 7
    assert task.test is None and task.evaluate(task.build(), "cpu").loss != task.evaluate(task.build(), "cpu").loss
    spec = TrainSpec(model=build_regressor, dataset=vector_loader, loss=mse, metric=mae)
    recorded = spec.to_dict()
    assert recorded["model"] == "mypkg.tasks:build_regressor" and recorded["loss"] == "mypkg.tasks:mse"
    assert TrainSpec.from_dict(recorded).task().model_name == "mypkg.tasks:build_regressor"  # a resume imports it
    local = TrainSpec(model=lambda: build_regressor(), dataset=vector_loader(), loss=torch.nn.MSELoss)
    assert part_name(local.model) == "<python test_objects_work_like_import_paths_and_are_recorded_by_name.<locals>" \
                                     ".<lambda>>"
    assert local.to_dict()["dataset"] == "<python DataLoader object>"
    with pytest.raises(UserInputError, match="resume or export it from Python, passing the same object again"):
        TrainSpec.from_dict(local.to_dict())
    x, y = next(local.task().stream(0, 1, 4, 0))
    with torch.no_grad():
        assert float(local.task().loss_of(local.task().build()(x), y)) > 0  # torch.nn.MSELoss: a loss class


@pytest.mark.parametrize(("options", "message"), [
    ({"dataset": "nopkg.data:make"}, "--dataset nopkg.data:make: cannot import nopkg.data on node"),
    ({"dataset": "mypkg.tasks:broken_set"},
     "--dataset mypkg.tasks:broken_set: the factory raised ValueError: no data here on node"),
    ({"dataset": "mypkg.tasks:empty_set"}, "--dataset mypkg.tasks:empty_set: the training dataset is empty (length 0)"),
    ({"loss": "mypkg.tasks:per_sample_loss"},
     "--loss mypkg.tasks:per_sample_loss returned a tensor of shape (32,), not a scalar: reduce it (e.g. .mean())"),
    ({"model": "mypkg.tasks:build_double"}, "parameter 0.weight is float64; the parameter shards hold float32 only"),
    ({"loss": None}, "the default loss, cross-entropy, wants class labels: pass your loss"),
])
def test_each_mistake_in_your_code_is_one_line(options, message):
    parts = {"model": "mypkg.tasks:build_regressor", "dataset": "mypkg.tasks:vectors", "loss": "mypkg.tasks:mse",
             **options}
    with pytest.raises(UserInputError) as err:
        build_task(parts["model"], parts["dataset"], loss=parts["loss"]).check(32, 2, 0)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_cli_says_each_mistake_in_one_line_before_starting_anything(tmp_path):
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT))
    for extra, message in ((["--loss", "mypkg.tasks:per_sample_loss"], "not a scalar"),
                           (["--loss", "mse"], "--loss must be an import path such as mypkg.module:function"),
                           (["--dataset", "mypkg.tasks:empty_set"], "is empty (length 0)")):
        args = ["--model", "mypkg.tasks:build_regressor", "--dataset", "mypkg.tasks:vectors",
                "--loss", "mypkg.tasks:mse", *extra, "--steps", "5"]
        res = subprocess.run([CMDARE, "train", *args], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 1, res.stdout
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr


def test_your_model_is_profiled_on_your_datas_shape_for_predict_plan_and_the_refit(tmp_path):
    import pandas as pd

    import cmdare.predict as P
    from cmdare.predict.refine import fit_speed_refinement, run_features

    w = run_features("mypkg.tasks:build_regressor", "mypkg.tasks:vectors")  # one sample: 8 features
    assert w.num_params == 8 * 16 + 16 + 16 + 1 and w.model_flops > 0 and not w.measured
    rows = pd.DataFrame({"run_id": ["a", "b", "c"], "model": "mypkg.tasks:build_regressor",
                         "dataset": "mypkg.tasks:vectors", "gpu": "k80", "workers": [1, 2, 3], "ps": 1,
                         "placement": "round-robin", "speed": [300.0, 520.0, 700.0]})
    fit = fit_speed_refinement(rows, P.speed_with_scales)["gpus"]["k80"]
    assert fit["runs"] == 3 and fit["heldout_mape_refined"] is not None
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT))
    for args in (["workloads", "--model", "mypkg.tasks:build_regressor", "--input-shape", "8", "--format", "json"],
                 ["predict", "step-time", "--model", "mypkg.tasks:build_regressor", "--input-shape", "8", "--gpu",
                  "v100"],
                 ["plan", "simulate", "--model", "mypkg.tasks:build_regressor", "--input-shape", "8", "--steps",
                  "1000", "--workers", "k80:2", "--runs", "5"]):
        res = subprocess.run([CMDARE, *args], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "extrapolate" in " ".join((res.stdout + res.stderr).split()) or '"input_shape": [' in res.stdout
    res = subprocess.run([CMDARE, "predict", "step-time", "--model", "mypkg.tasks:build_regressor", "--gpu", "v100"],
                         capture_output=True, text=True, env=env, timeout=120)  # on 3x32x32 images it cannot run
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "cannot profile it on input of shape 3,32,32" in res.stderr and "--input-shape" in res.stderr
