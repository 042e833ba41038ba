"""The wheel `cmdare cluster-config` packs from the running cmdare installs and imports elsewhere."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from cmdare import __version__
from cmdare.cloud.wheel_pack import pack_running_wheel


def test_packed_wheel_installs_and_runs_the_same_version(tmp_path):
    wheel = pack_running_wheel(tmp_path / "wheels")
    assert wheel.name == f"cmdare-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert zf.testzip() is None
        entry_points = zf.read(f"cmdare-{__version__}.dist-info/entry_points.txt").decode()
    assert "cmdare/__init__.py" in names and "cmdare/public_data/CREDITS.md" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "cmdare" in entry_points  # the console script
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    out = subprocess.run([sys.executable, "-c", "import cmdare, sys; print(cmdare.__version__, cmdare.__file__)"],
                         capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}).stdout.split()
    assert out[0] == __version__ and out[1].startswith(str(target))
