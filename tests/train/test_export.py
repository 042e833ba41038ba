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
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore
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


def test_export_writes_only_where_it_can_and_never_over_a_file_without_force(trained, tmp_path):
    """Issue 42, item 11: tracebacks for -o /proc/x.pt, /dev/full, FILE/sub.pt and safetensors into /proc; an
    existing file overwritten without a word and a symbolic link followed."""
    root, _, _ = trained
    env = dict(os.environ, CMDARE_HOME=str(tmp_path / "home"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([CMDARE, "export", "run-x", "--storage", str(root), *args], capture_output=True,
                              text=True, env=env, timeout=120)

    plain = tmp_path / "plain.txt"
    plain.write_text("mine")
    target = tmp_path / "target.txt"
    target.write_text("the link's target")
    link = tmp_path / "link.pt"
    link.symlink_to(target)
    cases = [
        (["-o", "/proc/x.pt"], "cannot write into /proc"),
        (["--format", "safetensors", "-o", "/proc/x.st"], "cannot write into /proc"),
        (["-o", "/dev/full"], "is a character device"),
        (["-o", "/dev/full", "--force"], "is a character device"),
        (["-o", str(plain / "sub.pt")], f"{plain} is a file, not a directory"),
        (["-o", str(tmp_path / "no" / "m.pt")], "does not exist"),
        (["-o", str(plain)], "exists: give --force"),
        (["-o", str(link)], "is a symbolic link"),
    ]
    for args, message in cases:
        res = run(*args)
        assert res.returncode == 1 and message in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    assert plain.read_text() == "mine" and target.read_text() == "the link's target" and link.is_symlink()
    assert {p.name for p in tmp_path.iterdir()} - {"home"} == {"link.pt", "plain.txt", "target.txt"}  # no debris
    for path in (plain, link):
        res = run("-o", str(path), "--force")
        assert res.returncode == 0, res.stderr
        assert len(torch.load(path, weights_only=True)) > 10
    assert not link.is_symlink() and target.read_text() == "the link's target"  # the link replaced, not followed


def test_a_write_that_fails_midway_leaves_no_file(trained, tmp_path):
    """A disk that fills up while the model is written: one line, and no half-written file under the name."""
    root, _, _ = trained
    out = tmp_path / "m.pt"
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # writes past 4 KiB fail with EFBIG\n"
              "from cmdare.cli import main\n"
              f"sys.argv = ['cmdare', 'export', 'run-x', '--storage', {str(root)!r}, '-o', {str(out)!r}]\n"
              "main()\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, CMDARE_HOME=str(tmp_path / "home")))
    assert res.returncode == 1 and "cannot write (File too large)" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not out.exists() and not list(tmp_path.glob(".cmdare-*"))


def test_safetensors_are_written_without_the_package(trained, tmp_path):
    """Issue 42: ``export --format safetensors`` seemed to need a package cmdare does not install. cmdare writes the
    format itself: with ``safetensors`` not importable (a plain install) the export works, and its line says that
    reading the file back (not writing it) needs ``pip install safetensors``."""
    root, model, _ = trained
    out = tmp_path / "model.safetensors"
    plain_install = ("import sys; sys.modules['safetensors'] = None; from cmdare.cli import main; "
                     "sys.argv = ['cmdare', *sys.argv[1:]]; main()")
    res = subprocess.run([sys.executable, "-c", plain_install, "export", "run-x", "--storage", str(root), "--format",
                          "safetensors", "--output", str(out)], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, CMDARE_HOME=str(tmp_path / "home")))
    assert res.returncode == 0, res.stderr
    assert "pip install safetensors: cmdare wrote the file without it" in res.stdout
    from safetensors.torch import load_file

    state = load_file(out)
    assert all(torch.equal(state[name], value) for name, value in model.state_dict().items())
