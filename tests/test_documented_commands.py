"""The commands README.md and docs/ show, run as written on a fresh home (issue 30: several failed as written:
``plan simulate`` without ``--model``, ``--cloud aws`` on its defaults, cluster-config's train line).

Each entry is a command exactly as it appears in its document (a line, or lines joined at a trailing
backslash; the test checks it is still there, so the list follows the docs) and runs here with exit 0, no
traceback and nothing on stderr but notes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# (document, command as written there)
DOCUMENTED = [
    ("docs/allreduce.md",
     "cmdare predict cluster-speed --model t2t_resnet15 --workers k80:2,v100:2 --topology allreduce"),
    ("docs/allreduce.md", "cmdare plan simulate --model t2t_resnet15 --steps 20000 --workers v100:4 --transient "
                          "--topology allreduce --revocations every=60"),
    ("README.md", "cmdare plan --model t2t_resnet32 --steps 64000 --deadline 2h"),
    ("README.md", "cmdare plan simulate --model t2t_resnet32 --steps 64000 --workers v100:8 --ps 1 --transient --json"),
    ("README.md", "cmdare workloads"),
    ("README.md", "cmdare catalog"),
    ("README.md", "cmdare runs"),
    ("docs/planner.md", "cmdare plan simulate --model t2t_resnet32 --steps 640000 --workers k80:8 --ps 2 --transient "
                        "--ps-transient --start-hour 14 --json"),
    ("docs/models.md", "cmdare predict step-time --model t2t_resnet32 --gpu k80"),
    ("docs/models.md", "cmdare predict cluster-speed --model t2t_resnet15 --workers k80:2,p100:2 --ps 2"),
    ("docs/cluster.md", "cmdare cluster-config --cloud local --workers k80:2,v100:1 --ps 1 --transient --storage "
                        "./ckpt -o cluster-local.yaml"),
    ("docs/reports.md", "cmdare report scaling --plot scaling.png"),
]


def _text(doc: str) -> str:
    """The document with lines joined (at a trailing backslash too) and runs of white space collapsed."""
    return re.sub(r"\s+", " ", (ROOT / doc).read_text(encoding="utf-8").replace("\\\n", " "))


@pytest.mark.parametrize(("doc", "command"), DOCUMENTED, ids=[c for _, c in DOCUMENTED])
def test_a_documented_command_runs_as_written(tmp_path, doc, command):
    assert command in _text(doc), f"{doc} no longer shows: {command}"
    args = shlex.split(command)
    env = dict(os.environ, CMDARE_HOME=str(tmp_path / "home"), COLUMNS="200")
    env.pop("CMDARE_DB_URL", None)
    res = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert not [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
