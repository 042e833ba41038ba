"""`cmdare export`: a run's trained model as a plain PyTorch state_dict that torch and safetensors load without
cmdare, giving exactly the outputs of the model the checkpoint was taken from (issue 33, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cmdare.datasets import load_dataset
from cmdare.storage import run_storage
from cmdare.train.checkpoint import Checkpoint, CheckpointStore
from cmdare.train.spec import TrainSpec
from cmdare.workloads import build_model

CMDARE = str(Path(sys.executable).parent / "cmdare")
# what a fresh process with torch (and safetensors) but not cmdare runs: build nothing, load the file
PLAIN_LOAD = """
import sys, torch
fmt, path = sys.argv[1], sys.argv[2]
if fmt == "torch":
    state = torch.load(path, weights_only=True)
else:
    from safetensors.torch import load_file
    state = load_file(path)
assert "cmdare" not in sys.modules
print(len(state), sum(int(t.numel()) for t in state.values()))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A resnet8 trained for a few plain SGD steps (its batch-norm statistics moved too), stored as a run's
    checkpoint of step 7 the way the trainer stores it: the flat parameters in model order, buffers by name."""
    root = tmp_path_factory.mktemp("storage")
    spec = TrainSpec(model="resnet8", dataset="digits", workers=1, ps=1, steps=10)
    data = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("resnet8", num_classes=data.num_classes, in_channels=data.input_shape[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = data.train_x[:64], data.train_y[:64]
    for _ in range(7):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    buffers = {k: v.detach().numpy().copy() for k, v in model.named_buffers()}
    ckpt = Checkpoint(7, flat, np.zeros_like(flat), buffers, {"run_id": "run-x", "spec": spec.to_dict()})
    CheckpointStore(run_storage("run-x", root)).save(ckpt)
    model.eval()
    return root, model, data.test_x[:32]


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_an_exported_model_gives_exactly_the_trained_outputs(trained, tmp_path, fmt):
    root, model, x = trained
    out = tmp_path / f"model.{fmt}"
    env = dict(os.environ, CMDARE_HOME=str(tmp_path / "home"))
    res = subprocess.run([CMDARE, "export", "run-x", "--storage", str(root), "--format", fmt, "--output", str(out)],
                         capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    assert f"resnet8 of run-x at step 7 to {out}" in res.stdout
    plain = subprocess.run([sys.executable, "-c", PLAIN_LOAD, fmt, str(out)], capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split()[0] == str(len(model.state_dict()))
    if fmt == "torch":
        state = torch.load(out, weights_only=True)
    else:
        from safetensors.torch import load_file

        state = load_file(out)
    fresh = build_model("resnet8", num_classes=10, in_channels=1)
    fresh.load_state_dict(state)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))  # exact: the same values in the same network
    for name, value in model.state_dict().items():  # every parameter and buffer (batch-norm statistics too)
        assert torch.equal(state[name], value), name


def test_bad_export_requests_are_one_line(trained, tmp_path):
    root, _, _ = trained
    env = dict(os.environ, CMDARE_HOME=str(tmp_path / "home"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([CMDARE, "export", *args], capture_output=True, text=True, env=env, timeout=120)

    cases = [
        (["run-x", "--storage", str(root), "--format", "onnx", "-o", str(tmp_path / "m")], "--format must be one of"),
        (["run-x", "--storage", str(root), "--step", "3", "-o", str(tmp_path / "m")], "no checkpoint of step 3"),
        (["run-y", "--storage", str(root), "-o", str(tmp_path / "m")], "no checkpoint"),
        (["run-x", "--storage", str(root), "-o", str(tmp_path)], "is a directory"),
    ]
    for args, message in cases:
        res = run(*args)
        assert res.returncode == 1 and message in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
