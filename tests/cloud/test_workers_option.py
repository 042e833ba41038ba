"""``--workers`` is read by one parser in every command (issue 42: ``plan simulate --workers 4`` and ``predict
cluster-speed --workers 4`` said ``unknown GPU '4'``, ``train --workers 4`` took a count)."""

from __future__ import annotations

import pytest

from cmdare.cloud.catalog import default_catalog
from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, Workers, default_gpu_note, parse_workers
from cmdare.cloud.launcher import worker_groups
from cmdare.errors import UnknownNameError, UserInputError
from cmdare.plan.spec import parse_workers as plan_workers
from cmdare.train.spec import TrainSpec


def test_a_count_or_a_mix():
    assert parse_workers("4") == Workers(4) and parse_workers(4) == Workers(4) and parse_workers(" +3 ") == Workers(3)
    assert parse_workers("4").counts() == {DEFAULT_WORKER_GPU: 4} and parse_workers("4").counts("K80") == {"k80": 4}
    mix = parse_workers("K80:2, v100,k80")
    assert mix.total == 4 and mix.mix == {"k80": 3, "v100": 1} and mix.mix_text == "k80:3,v100:1"
    assert mix.counts("t4") == {"k80": 3, "v100": 1}


@pytest.mark.parametrize(("text", "error", "needle"), [
    ("0", UserInputError, "--workers must be at least 1, got 0"),
    ("-2", UserInputError, "at least 1, got -2"),
    ("2.5", UserInputError, "whole number or a mix"),
    ("1e3", UserInputError, "whole number or a mix"),
    ("k80:0", UserInputError, "need at least 1 worker of k80, got 0"),
    ("k80:2,v100:0", UserInputError, "at least 1 worker of v100"),
    ("k80:-1", UserInputError, "negative GPU count"),
    ("k80:x", UserInputError, "bad GPU count 'k80:x'"),
    (",", UserInputError, "no GPUs"),
    ("h800:2", UnknownNameError, "h800"),
])
def test_mistakes_are_one_line(text, error, needle):
    with pytest.raises(error, match=needle) as err:
        parse_workers(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["4", "1", "k80:2,v100:1", "t4", "v100:3"])
def test_every_command_reads_the_same(text):
    """train, plan simulate, predict cluster-speed and cluster-config agree on what a value means."""
    parsed = parse_workers(text)
    assert TrainSpec.parse_workers(text) == (parsed.total, parsed.mix_text)
    assert {g.gpu: g.count for g in plan_workers(text, True, "us-east1")} == parsed.counts()
    catalog = default_catalog()
    assert {g.lower(): n for g, n in worker_groups(catalog, None, text)} == parsed.counts()


@pytest.mark.parametrize("text", ["0", "k80:0", "2.5"])
def test_every_command_refuses_the_same(text):
    for read in (parse_workers, TrainSpec.parse_workers, lambda t: plan_workers(t, True, "r"),
                 lambda t: worker_groups(default_catalog(), None, t)):
        with pytest.raises(UserInputError):
            read(text)


def test_the_note_names_the_default_gpu():
    assert default_gpu_note(4, "t4", "gcp") == ("--workers 4: 4 x T4 (the default GPU of gcp; --workers TYPE:N for "
                                               "another, e.g. v100:4)")
    assert default_gpu_note(4, "T4", typed=False).startswith("--workers 4 (the default): 4 x T4 (the default GPU;")
