"""Profiles of the built-in models kept on disk (issue 30: ``cmdare workloads`` took 19-24 s, building all 27
networks on every call)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cmdare.workloads.profile import WorkloadProfile, _profile_by_name, profile_model
from cmdare.workloads.profile_cache import cached_profile, profile_cache_file


def test_a_cached_profile_equals_the_computed_one():
    fresh = _profile_by_name("resnet20", (3, 32, 32), 10)
    assert profile_model("resnet20") == fresh  # stored, or read back: the same figures
    assert profile_model("resnet20") == fresh
    assert WorkloadProfile.from_dict(fresh.to_dict()) == fresh
    assert "resnet20|3x32x32|10" in profile_cache_file().read_text()


def test_the_cache_answers_without_computing_and_keys_by_shape_and_classes():
    calls = []

    def compute():
        calls.append(1)
        return _profile_by_name("resnet8", (1, 8, 8), 7)

    first = cached_profile("resnet8", (1, 8, 8), 7, compute, WorkloadProfile.from_dict)
    again = cached_profile("resnet8", (1, 8, 8), 7, compute, WorkloadProfile.from_dict)
    assert first == again and len(calls) <= 1  # 0: an earlier test of this session stored it
    other = profile_model("resnet8", (1, 8, 8), 3)
    assert other.num_classes == 3 and other.num_params != first.num_params


def test_a_replaced_builtin_name_is_profiled_from_its_own_builder():
    from torch import nn

    from cmdare.workloads.registry import describe_model, register_model
    from cmdare.workloads.specs import MODELS

    before = profile_model("resnet56")
    saved = dict(MODELS)
    register_model("resnet56", lambda num_classes, in_channels: nn.Sequential(
        nn.Conv2d(in_channels, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes)),
        "a user's network under a zoo name", replace=True)
    try:
        mine = profile_model("resnet56")
        assert mine.num_params == 3 * 4 * 9 + 4 + 4 * 10 + 10 != before.num_params
        assert describe_model("resnet56") == "a user's network under a zoo name"
    finally:
        MODELS.clear()
        MODELS.update(saved)  # the zoo as it was, in its order
    assert profile_model("resnet56") == before


@pytest.mark.parametrize("run", [1, 2])
def test_workloads_reads_cached_profiles_without_importing_torch(tmp_path_factory, run):
    home = tmp_path_factory.getbasetemp() / "workloads-home"  # shared by both runs: the first fills it
    env = dict(os.environ, CMDARE_HOME=str(home))
    probe = ("import sys; from cmdare.cli import main\n"
             "sys.argv = ['cmdare', 'workloads', '--format', 'json', '-m', 'resnet8', '-m', 'shake_shake_96']\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('torch loaded:', 'torch' in sys.modules, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0 and '"name": "shake_shake_96"' in res.stdout, res.stderr
    assert res.stderr.strip().endswith(f"torch loaded: {run == 1}")
