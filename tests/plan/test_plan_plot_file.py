"""`cmdare plan --plot FILE` writes as every user-named file is written (issue 42, item 11): checked before the
simulation, never over an existing file or through a symbolic link without --force."""

from __future__ import annotations

from pathlib import Path

from plan_toys import run_cli

PLAN = ("plan", "--model", "t2t_resnet32", "--steps", "6400", "--gpus", "k80", "--max-workers", "2", "--runs", "5")


def test_the_plot_is_refused_before_simulating_and_replaced_only_with_force(monkeypatch, capsys, tmp_path: Path):
    png = tmp_path / "p.png"
    png.write_bytes(b"mine")
    link = tmp_path / "link.png"
    link.symlink_to(png)
    for path, needle in [(png, "exists: give --force"), (link, "is a symbolic link"),
                         (Path("/proc/p.png"), "cannot write into /proc"), (tmp_path / "p.foo", "cannot write .foo"),
                         (png / "sub.png", "is a file, not a directory")]:
        code, out, err = run_cli(monkeypatch, capsys, *PLAN, "--plot", str(path))
        assert code == 1 and needle in err and len(err.strip().splitlines()) == 1, (path, err)
        assert "Pareto" not in out  # nothing simulated
    assert png.read_bytes() == b"mine" and link.is_symlink()
    code, out, err = run_cli(monkeypatch, capsys, *PLAN, "--plot", str(link), "--force")
    assert code == 0, err
    assert not link.is_symlink() and link.read_bytes()[:4] == b"\x89PNG" and png.read_bytes() == b"mine"
