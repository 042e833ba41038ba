"""`cmdare train` on bad input: one line, non-zero exit, nothing saved is damaged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cmdare.train.duties.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint

CMDARE = [str(Path(sys.executable).parent / "cmdare")]


def _run(args, home):
    env = dict(os.environ, CMDARE_HOME=str(home))
    return subprocess.run(CMDARE + ["train", "--no-record", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("args", [
    ["--model", "no-such-model"],
    ["--dataset", "no-such-data"],
    ["--workers", "0"],
    ["--ps", "0"],
    ["--dataset", "cifar10", "--data-dir", "/no/such/dir"],
    ["--address", "127.0.0.1:1"],
    ["--placement", "no-such-placement"],
    ["--gpu", "no-such-gpu"],
    ["--region", "nowhere-1"],
    ["--revocations", "lifetime=/no/such/lifetimes.json"],
    ["--revocations", "every=-2"],
    ["--revocations", "every=5,notice=-1"],
    ["--revocations", "every=5,hit=head"],
    ["--replace", "sometimes"],
    ["--lr-policy", "wild"],
    ["--straggler", "9:3"],
    ["--ps-bandwidth", "fast"],
    ["--ps-bandwidth", "0MB/s"],
    ["--elastic-ps"],
    ["--workers", "k80:x"],
    ["--workers", "many"],
    ["--workers", "k80:2,nosuchgpu:1"],
    ["--gpus-per-worker", "lots"],
    ["--gpus-per-worker", "-1"],
    ["--replacement-timeout", "0"],
    ["--lr", "nan"],  # trained to exit 0 at accuracy 0.078 before issue 29
    ["--storage", "memory://ckpt"],  # checkpoints that vanish with the process
    ["--from-step", "10"],  # without --resume
    ["--on-diverge", "sometimes"],
])
def test_bad_input_is_one_line(tmp_path, args):
    res = _run([*args, "--steps", "5"], tmp_path)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr + res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr


def test_corrupt_checkpoint_is_refused_and_kept(tmp_path):
    run_dir = tmp_path / "checkpoints" / "run-x"
    path, _ = save_checkpoint(run_dir, Checkpoint(10, np.zeros(5, np.float32), np.zeros(5, np.float32)))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    res = _run(["--resume", "run-x", "--model", "resnet8", "--steps", "20"], tmp_path)
    assert res.returncode != 0 and "checksum mismatch" in res.stderr and "Traceback" not in res.stderr
    assert latest_checkpoint(run_dir) == path and path.read_bytes() == bytes(data)  # left as it was


def test_ps_commands_refuse_finished_runs_and_the_last_shard(tmp_path):
    from cmdare.train.runtime.run_files import write_status

    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    run_dir = tmp_path / "checkpoints" / "run-p"

    def ps(*args):
        return subprocess.run(CMDARE + ["ps", *args], capture_output=True, text=True, env=env, timeout=60)

    res = ps("add", "run-none")
    assert res.returncode == 1 and "no running training run" in res.stderr
    write_status(run_dir, "running", 1, 10)
    res = ps("remove", "run-p")
    assert res.returncode == 1 and "last shard" in res.stderr and "Traceback" not in res.stderr
    assert ps("add", "run-p").returncode == 0 and len(list((run_dir / "control").glob("*.json"))) == 1
    write_status(run_dir, "finished", 2, 100)
    res = ps("add", "run-p")
    assert res.returncode == 1 and "finished" in res.stderr


#: Tags ``TensorBoardCallback`` documents (src/cmdare/measure/tensorboard.py, docs/reports.md).
TB_TAGS = ("global_step/sec", "loss", "accuracy", "checkpoint_s")


@pytest.mark.cluster  # make test-cluster: three real CLI runs
@pytest.mark.parametrize("where", ["default", "none", "dir"])
def test_tensorboard_scalars_by_default(tmp_path, where):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    home, custom = tmp_path / "home", tmp_path / "tb-custom"
    opt = {"default": [], "none": ["--tensorboard", "none"], "dir": ["--tensorboard", str(custom)]}[where]
    res = _run(["--model", "resnet8", "--steps", "30", "--workers", "1", "--on-demand", "--checkpoint-every", "15",
                "--eval-every", "15", *opt], home)
    assert res.returncode == 0, res.stdout + res.stderr
    run_id = re.search(r"^run (run-\S+) finished", res.stdout, re.M).group(1)
    default_dir = home / "tensorboard" / run_id
    if where == "none":
        assert not (home / "tensorboard").exists() and not custom.exists()
        return
    logdir = default_dir if where == "default" else custom
    assert list(logdir.glob("events.out.tfevents.*")), f"no event file in {logdir}"
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    for tag in TB_TAGS:
        assert tag in scalars, (tag, scalars)
        assert len(acc.Scalars(tag)) >= 1
    assert max(e.step for e in acc.Scalars("loss")) == 30
    assert acc.Scalars("accuracy")[-1].step == 30 and 0.0 <= acc.Scalars("accuracy")[-1].value <= 1.0


_TWO_AT_ONCE = """
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec

# both servers (the chief's among them) revoked at once: 15 emulated seconds of 1 s steps on two workers, step 30
spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=120, batch_size=32,
                 optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, seed=0, transient=True,
                 revocations="trace=15@0+15@1,step=1", replace="same", startup="0")
trainer = Trainer(spec)
s = trainer.run()
print(f"status {s.status} step {s.global_step} revoked {s.revocations} replaced {s.replacements}")
"""


@pytest.mark.cluster  # make test-cluster: a CLI run with two revocations at once
def test_two_revocations_in_one_tick_print_no_unhandled_ray_errors(tmp_path):
    # Both workers revoked at once, replacements with no start-up delay. Calls on revoked workers fail; the
    # coordinator must fetch each failed result itself instead of leaving it for Ray to print as an
    # "Unhandled error ... ActorDiedError" block.
    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", _TWO_AT_ONCE], capture_output=True, text=True, env=env, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert re.search(r"^status finished step 120 revoked 2 replaced 2$", res.stdout, re.M), out
    for bad in ("Unhandled error", "Traceback", "ActorDiedError", "RayActorError"):
        assert bad not in out, out


def test_a_joined_cluster_gets_no_injected_revocations_by_default():
    from cmdare.train.cli.train_cmd import DEFAULT_REVOCATIONS, default_revocations

    assert default_revocations(None, None) == DEFAULT_REVOCATIONS  # a local run: emulated servers
    assert default_revocations(None, "auto") == "none"  # real servers: revoked by their cloud only
    assert default_revocations("every=5", "auto") == "every=5"  # injection on real servers only when asked


def test_a_spec_without_a_queued_chunk_is_refused_in_one_line():
    from cmdare.errors import UserInputError
    from cmdare.train.spec import TrainSpec

    for bad in (0, -1):
        with pytest.raises(UserInputError, match="chunks-ahead must be at least 1"):
            TrainSpec(chunks_ahead=bad)
    assert TrainSpec(chunks_ahead=1).chunks_ahead == 1 and TrainSpec().chunks_ahead == 2


def test_train_overhead_bench_refuses_no_queued_chunk_in_one_line():
    bench = Path(__file__).resolve().parents[2] / "bench" / "train_overhead.py"
    res = subprocess.run([sys.executable, str(bench), "--chunks-ahead", "0"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "--chunks-ahead must be at least 1" in res.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("bad", [{"on_diverge": "sometimes"}, {"on_diverge": "rollback:0"},
                                 {"on_diverge": "rollback:x"}, {"on_diverge": "stop:2"},
                                 {"rollback_lr_scale": 0.0}, {"rollback_lr_scale": 2.0}])
def test_bad_divergence_settings_are_one_line_errors(bad):
    from cmdare.errors import UserInputError
    from cmdare.train.spec import TrainSpec

    with pytest.raises(UserInputError, match="--on-diverge|--rollback-lr-scale") as err:
        TrainSpec(**bad)
    assert "\n" not in str(err.value)
    assert [TrainSpec(on_diverge=t).max_rollbacks() for t in ("stop", "rollback", "Rollback:7")] == [0, 3, 7]


@pytest.mark.cluster  # make test-cluster: a real run until it diverges
def test_a_diverging_run_ends_with_one_line_and_stores_nothing_non_finite(tmp_path):
    """Issue 29: a run whose parameters went NaN finished with exit 0 at chance accuracy, storing NaN
    checkpoints that rotated the good ones out."""
    res = _run(["--lr", "1e6", "--steps", "300", "--checkpoint-every", "5"], tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr + res.stdout
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: training diverged: worker"), res.stderr
    for run_dir in (tmp_path / "checkpoints").iterdir():
        for path in run_dir.glob("ckpt-*.json"):
            ckpt = load_checkpoint(path)  # loading refuses non-finite values: every stored one is finite
            assert np.isfinite(ckpt.params).all()


@pytest.mark.cluster  # make test-cluster: a real run that diverges, rolls back and trains on
def test_a_diverging_run_rolls_back_with_a_lower_learning_rate_and_finishes(tmp_path):
    """Issue 29: --on-diverge rollback: the shards go back to the newest stored checkpoint (here, before the
    first, the initial parameters), the learning rate is scaled down, and the run trains to its end."""
    env = dict(os.environ, CMDARE_HOME=str(tmp_path))
    res = subprocess.run(CMDARE + ["train", "--lr", "1e8", "--steps", "150", "--checkpoint-every", "20",
                                   "--on-diverge", "rollback:1", "--rollback-lr-scale", "1e-9"],
                         capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0 and "Traceback" not in res.stderr + res.stdout, res.stderr
    assert "warning: training diverged (worker " in res.stderr  # names the worker, the loss and its step
    assert "rolled back to step 20, the newest stored checkpoint" in res.stderr or \
        "rolled back to the start of the run (step 0: no checkpoint was stored yet)" in res.stderr, res.stderr
    assert "learning rate x1e-09 from now on (rollback 1 of 1)" in res.stderr
    assert "training diverged 1 time(s): rolled back to the newest stored checkpoint" in res.stdout
    accuracy = float(res.stdout.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.5  # at lr 0.1 after the rollback: trained, not at chance (0.1)
    import sqlite3

    with sqlite3.connect(tmp_path / "cmdare.db") as db:
        rows = db.execute("SELECT details FROM events WHERE kind = 'shard_restored'").fetchall()
    assert len(rows) == 1 and '"reason": "diverged"' in rows[0][0]
    for path in (tmp_path / "checkpoints").glob("*/ckpt-*.json"):
        assert np.isfinite(load_checkpoint(path).params).all()
