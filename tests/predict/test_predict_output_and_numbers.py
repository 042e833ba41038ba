"""`cmdare predict ... --output` writes as every user-named file is written, and numbers that overflow a model are
refused in one line (issue 42, item 11: `predict checkpoint --size-mb 1e308` ended in a traceback; `predict
step-time ... --output /proc/x.csv` ignored --output and exited 0)."""

from __future__ import annotations

import pytest

from cli_inprocess import one_error, run_cmdare


def run(tmp_path, *args: str) -> tuple[int, str, str]:
    return run_cmdare(tmp_path / "home", *args)


@pytest.mark.parametrize(("args", "fragment"), [
    (["checkpoint", "--size-mb", "1e308"], "--size-mb must be at most 1e+08 MB"),
    (["checkpoint", "--size-mb", "inf"], "--size-mb must be a finite number of MB"),
    (["checkpoint", "--size-mb", "1", "--tensors", "99999999999999"], "--tensors must be at most"),
    (["step-time", "--model", "resnet32", "--gpu", "1e308"], "--gpu must be at most 10000 TFLOPS"),
    (["step-time", "--model", "resnet32", "--gpu", "k80", "--latency-ms", "1e308"], "--latency-ms must be at most"),
])
def test_numbers_beyond_what_the_models_answer_are_one_line(tmp_path, args, fragment):
    assert one_error(run(tmp_path, "predict", *args), fragment)


def test_output_without_input_is_refused_not_ignored(tmp_path):
    res = run(tmp_path, "predict", "step-time", "--model", "resnet32", "--gpu", "k80", "--output", "/proc/x.csv")
    assert one_error(res, "--output writes the answers to an --input table")


def test_the_answered_table_is_written_only_where_it_can_be(tmp_path):
    table = tmp_path / "in.csv"
    table.write_text("key,Checkpoint Size (MB),Number of Tensors\na,100,10\nb,1000,200\n")
    out = tmp_path / "out.csv"
    (tmp_path / "FILE").write_text("")
    for path, fragment in [("/proc/x.csv", "cannot write into /proc"), ("/dev/full", "character device"),
                           (str(tmp_path / "FILE" / "o.csv"), "is a file, not a directory"),
                           (str(tmp_path / "no" / "o.csv"), "does not exist")]:
        assert one_error(run(tmp_path, "predict", "checkpoint", "--input", str(table), "--output", path), fragment)
    code, stdout, err = run(tmp_path, "predict", "checkpoint", "--input", str(table), "--output", str(out))
    assert code == 0 and "wrote 2 rows" in stdout, err
    first = out.read_text()
    assert first.splitlines()[0] == "key,Checkpoint Size (MB),Number of Tensors,Predicted Duration (s)"
    out.write_text("mine")
    assert one_error(run(tmp_path, "predict", "checkpoint", "--input", str(table), "--output", str(out)),
                     "exists: give --force")
    assert out.read_text() == "mine"
    assert run(tmp_path, "predict", "checkpoint", "--input", str(table), "--output", str(out), "--force")[0] == 0
    assert out.read_text() == first and not list(tmp_path.glob(".cmdare-*"))


def test_models_evaluate_checks_its_plot_files_before_evaluating(tmp_path):
    (tmp_path / "FILE").write_text("")
    assert one_error(run(tmp_path, "models", "evaluate", "--task", "checkpoint_remote", "--plot-dir",
                         str(tmp_path / "FILE" / "plots")), "is a file, not a directory")
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "models_checkpoint_remote.png").write_text("mine")
    assert one_error(run(tmp_path, "models", "evaluate", "--task", "checkpoint_remote", "--plot-dir", str(plots)),
                     "models_checkpoint_remote.png: exists: give --force")
    assert (plots / "models_checkpoint_remote.png").read_text() == "mine"
    code, _, err = run(tmp_path, "models", "evaluate", "--task", "checkpoint_remote", "--plot-dir", str(plots),
                       "--force")
    assert code == 0, err
    assert (plots / "models_checkpoint_remote.png").read_bytes()[:4] == b"\x89PNG"
