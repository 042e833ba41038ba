"""A practitioner's own model given by import path (issue 33): profiled and predicted from its profile, with the
prediction labelled an extrapolation; each way a path can fail is one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CMDARE = str(Path(sys.executable).parent / "cmdare")
PROJECT = Path(__file__).parent / "user_project"


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT), COLUMNS="250")
    return subprocess.run([CMDARE, *args], capture_output=True, text=True, env=env, timeout=180)


def test_a_users_model_is_profiled_by_import_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))
    from cmdare.workloads import build_model, profile_model

    net = build_model("mypkg.models:build_net", num_classes=5, in_channels=1)
    assert net[-1].out_features == 5 and net[0].in_channels == 1  # the factory got the sizes it takes
    profile = profile_model("mypkg.models:build_net", (3, 32, 32), 10)
    assert profile.num_params == sum(p.numel() for p in build_model("mypkg.models:build_net").parameters())
    assert profile.flops_per_sample_train > 0
    fixed = profile_model("mypkg.models:build_fixed")  # a factory without arguments keeps its own sizes
    assert fixed.num_params == 3 * 8 * 9 + 8 + 8 * 10 + 10
    res = _cli(tmp_path, "workloads", "--model", "mypkg.models:build_net", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert '"name": "mypkg.models:build_net"' in res.stdout and "your model, built by" in res.stdout


def test_predict_extrapolates_for_a_users_model_and_says_so(tmp_path):
    res = _cli(tmp_path, "predict", "step-time", "--model", "mypkg.models:build_net", "--gpu", "v100",
               "--interval", "0.9")
    assert res.returncode == 0, res.stderr
    assert "mypkg.models:build_net was not measured by CM-DARE" in res.stderr and "extrapolates" in res.stderr
    assert "s/step (90% interval" in res.stdout


@pytest.mark.parametrize(("path", "message"), [
    ("nopkg.models:build_net", "cannot import nopkg.models on node"),
    ("mypkg.models:missing", "mypkg.models has no missing on node"),
    ("mypkg.models:NOT_CALLABLE", "NOT_CALLABLE is not callable"),
    ("mypkg.models:broken", "the factory raised ValueError: width must be even on node"),
    ("mypkg.models:not_a_model", "the factory returned dict, not a torch.nn.Module"),
])
def test_a_bad_import_path_is_one_line(tmp_path, path, message):
    res = _cli(tmp_path, "workloads", "--model", path)
    assert res.returncode == 1, res.stdout
    assert res.stderr.strip().splitlines() == [f"error: --model {path}: " + res.stderr.split(f"{path}: ", 1)[1].strip()]
    assert message in res.stderr


@pytest.mark.cluster  # a real training run on Ray, its export and a failed one: the long end-to-end tier
@pytest.mark.timeout(300)
def test_a_users_model_trains_on_ray_workers_by_import_path_and_exports(tmp_path):
    """The workers are Ray actors in other processes: each imports the factory itself (nothing registered)."""
    res = _cli(tmp_path, "train", "--model", "mypkg.models:build_net", "--steps", "60", "--workers", "2",
               "--checkpoint-every", "30", "--eval-every", "0", "--tensorboard", "none")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "finished: step 60" in res.stdout, res.stdout
    run = res.stdout.split("run ", 1)[1].split()[0]
    out = tmp_path / "net.pt"
    exported = _cli(tmp_path, "export", run, "--output", str(out))
    assert exported.returncode == 0, exported.stderr
    load = ("import sys, torch; from mypkg.models import build_net; net = build_net(10, 1); "
            "net.load_state_dict(torch.load(sys.argv[1], weights_only=True)); print('loaded')")
    plain = subprocess.run([sys.executable, "-c", load, str(out)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(PROJECT)))
    assert plain.stdout.strip() == "loaded", plain.stderr
    bad = _cli(tmp_path, "train", "--model", "nopkg.models:build_net", "--steps", "10", "--no-record")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert bad.stderr.startswith("error: --model nopkg.models:build_net: cannot import nopkg.models on node")
