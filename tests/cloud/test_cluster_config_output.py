"""`cmdare cluster-config -o`: no name or value the user gives adds content to the YAML, and the file is written
as every user-named file is (issue 42, item 11)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from cmdare.cloud.commands import register
from cmdare.errors import UserInputError
from cmdare.plan.catalog_command import catalog_command

EVIL = "x\ndocker: {image: evilimage}\n#.yaml"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    register(app)
    app.command("catalog")(catalog_command)  # two commands: the app takes the command's name
    return app


@pytest.fixture(autouse=True)
def _here(tmp_path, monkeypatch):
    monkeypatch.delenv("CMDARE_CATALOG", raising=False)
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def _run(app, *args: str):
    return CliRunner().invoke(app, list(args))


def _keys(path: Path) -> list[str]:
    return list(yaml.safe_load(path.read_text()))


LOCAL = ("cluster-config", "--cloud", "local", "--gpu", "k80", "--workers", "1")


def test_a_file_name_with_newlines_adds_no_yaml_keys(app, tmp_path):
    plain = tmp_path / "plain.yaml"
    assert _run(app, *LOCAL, "-o", str(plain)).exit_code == 0
    out = _run(app, *LOCAL, "-o", EVIL)
    assert out.exit_code == 0, out.output
    written = tmp_path / EVIL
    assert _keys(written) == _keys(plain) and "docker" not in _keys(written)
    text = written.read_text()
    assert "x\\ndocker: {image: evilimage}\\n#.yaml" in text  # the name, escaped, in the header comment
    assert yaml.safe_load(text)["head_start_ray_commands"][0].count(str(written)) == 1  # and whole in the command


@pytest.mark.parametrize("sep", ["\n", "\r", "\x85", "\u2028", "\u2029", "\x0b", "\x01"])
def test_no_pip_spec_adds_keys_to_a_cloud_config(app, tmp_path, sep):
    """Values go into the header's comments too: no line break YAML knows (NEL, LS, PS included) ends them, and
    no control character makes the file unreadable."""
    base = ("cluster-config", "--cloud", "gcp", "--gpu", "t4", "--workers", "1", "--transient", "--storage",
            "gs://bucket/ckpt")
    plain, evil = tmp_path / "plain.yaml", tmp_path / "evil.yaml"
    ok = _run(app, *base, "--cmdare-spec", "cmdare==0.1.0", "-o", str(plain))
    assert ok.exit_code == 0, ok.output
    out = _run(app, *base, "--cmdare-spec", f"cmdare==0.1.0{sep}evil_key: 1", "-o", str(evil))
    assert out.exit_code == 0, out.output
    assert _keys(evil) == _keys(plain)
    comments = [line for line in evil.read_text().splitlines() if line.startswith("#")]
    assert len(comments) == len([line for line in plain.read_text().splitlines() if line.startswith("#")])


def test_the_output_file_is_never_replaced_without_force(app, tmp_path):
    target = tmp_path / "cluster.yaml"
    target.write_text("mine: 1\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    (tmp_path / "FILE").write_text("")
    for path, needle in [(target, "exists: give --force"), (link, "is a symbolic link"),
                         (tmp_path / "FILE" / "sub.yaml", "is a file, not a directory"),
                         (Path("/proc/x.yaml"), "cannot write into /proc"), (Path("/dev/full"), "character device")]:
        out = _run(app, *LOCAL, "-o", str(path))
        assert isinstance(out.exception, UserInputError) and needle in str(out.exception), (path, out.output)
    assert target.read_text() == "mine: 1\n" and link.is_symlink()
    out = _run(app, *LOCAL, "-o", str(link), "--force")
    assert out.exit_code == 0, out.output
    assert not link.is_symlink() and "cluster_name" in _keys(link) and target.read_text() == "mine: 1\n"
    assert not list(tmp_path.glob(".cmdare-*"))
