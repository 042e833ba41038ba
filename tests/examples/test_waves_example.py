"""The example project of ``examples/waves`` (issue 33), run as its README says: a forecaster that is no image
classifier, its own data, loss and metric, trained through the Python API and through the CLI by import paths,
with injected revocations and a resume; the exported file loads into plain PyTorch (cmdare not importable) and
gives exactly the outputs of the network the run's checkpoint describes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "waves"
CMDARE = str(Path(sys.executable).parent / "cmdare")

pytestmark = pytest.mark.cluster  # two end-to-end runs on Ray: the long tier

PLAIN_TORCH = """
import sys
sys.modules["cmdare"] = None  # plain PyTorch: any import of cmdare fails
import torch
from safetensors.torch import load_file
from waves.data import make_sets
from waves.model import build_net
path, out = sys.argv[1], sys.argv[2]
net = build_net()
net.load_state_dict(load_file(path) if path.endswith(".safetensors") else torch.load(path, weights_only=True))
with torch.no_grad():
    torch.save(net(make_sets(0)[1].inputs), out)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, CMDARE_HOME=str(tmp_path / "home"), PYTHONPATH=str(EXAMPLE), COLUMNS="200")


def _outputs_of_checkpoint(run_dir: Path) -> torch.Tensor:
    """The test outputs of the network the run's newest checkpoint describes, built by cmdare."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        from waves.data import make_sets
        from waves.model import build_net

        from cmdare.storage import as_storage
        from cmdare.train import TrainSpec
        from cmdare.train.duties.checkpoint import CheckpointStore
        from cmdare.train.duties.export import checkpoint_state_dict

        store = CheckpointStore(as_storage(str(run_dir)))
        ckpt = store.load(store.resume_point(None))
        net = build_net()
        net.load_state_dict(checkpoint_state_dict(ckpt, TrainSpec.from_dict(ckpt.meta["spec"])))
        with torch.no_grad():
            return net(make_sets(0)[1].inputs)
    finally:
        sys.path.remove(str(EXAMPLE))


def _plain_outputs(tmp_path: Path, exported: Path) -> torch.Tensor:
    out = tmp_path / f"{exported.name}.outputs.pt"
    res = subprocess.run([sys.executable, "-c", PLAIN_TORCH, str(exported), str(out)], capture_output=True,
                         text=True, env=_env(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr
    return torch.load(out, weights_only=True)


def test_the_example_trains_through_the_api_with_revocations_and_a_resume(tmp_path):
    res = subprocess.run([sys.executable, "train_api.py", "--steps", "400", "--out", str(tmp_path / "api")],
                         cwd=EXAMPLE, capture_output=True, text=True, env=_env(tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    losses = [float(v) for v in re.findall(r"step \d+: test mse ([\d.]+)", res.stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0], res.stdout  # evaluated at 100, 200 | 300, 400
    revoked = [int(v) for v in re.findall(r"(\d+) revoked", res.stdout)]
    assert len(revoked) == 2 and revoked[0] >= 1, res.stdout
    assert "resumed from step 200: step 400" in res.stdout
    exported = tmp_path / "api" / "waves.pt"
    assert torch.equal(_plain_outputs(tmp_path, exported), _outputs_of_checkpoint(tmp_path / "api" / "runs" / "waves"))


def test_the_example_trains_through_the_cli_by_import_path_and_exports_safetensors(tmp_path):
    env, storage = _env(tmp_path), tmp_path / "cli"
    task = ["--model", "waves.model:build_net", "--dataset", "waves.data:make_sets", "--loss", "waves.losses:mse",
            "--metric", "waves.losses:mae", "--lr", "0.005", "--weight-decay", "0", "--storage", str(storage)]
    first = subprocess.run([CMDARE, "train", *task, "--workers", "2", "--ps", "1", "--steps", "200", "--transient",
                            "--revocations", "every=60,step=1", "--checkpoint-every", "100"],
                           capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    run = re.search(r"run (\S+) finished: step 200 in [\d.]+ s, test loss ([\d.]+), mae ([\d.]+)", first.stdout)
    assert run, first.stdout
    assert int(re.search(r"servers: (\d+) revoked", first.stdout).group(1)) >= 1, first.stdout
    second = subprocess.run([CMDARE, "train", "--resume", run.group(1), "--steps", "300"], capture_output=True,
                            text=True, env=env, timeout=600)  # the stored import paths are imported again
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = re.search(r"finished: step 300 in [\d.]+ s, test loss ([\d.]+)", second.stdout)
    assert resumed and float(resumed.group(1)) < float(run.group(2)) * 1.5, second.stdout
    out = tmp_path / "waves.safetensors"
    exp = subprocess.run([CMDARE, "export", run.group(1), "--output", str(out), "--format", "safetensors"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert exp.returncode == 0, exp.stderr
    assert "waves.model:build_net" in exp.stdout and "at step 300" in exp.stdout
    assert torch.equal(_plain_outputs(tmp_path, out), _outputs_of_checkpoint(storage / run.group(1)))
