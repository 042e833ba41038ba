"""A profile never ends a run (issue 42): a language model on integer token ids is traced with its data's dtype;
one the meta trace cannot follow (``nn.TransformerEncoder``'s causal-mask check calls ``.item()``) is counted on a
real sample; one that cannot be profiled at all has its step time measured; each fallback says so in one line,
and the hints of ``predict``/``workloads``/``plan`` name what failed. Recurrent and attention layers count
their FLOPs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from cmdare.workloads import profile_model
from cmdare.workloads.flops import count_forward
from cmdare.workloads.profile import ProfileError

PROJECT = Path(__file__).parent / "user_project"
CMDARE = str(Path(sys.executable).parent / "cmdare")
BPTT, VOCAB, WIDTH = 12, 48, 32


@pytest.fixture(autouse=True)
def _user_project(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))


def _ids() -> torch.Tensor:
    from wordlm.data import make_sets

    return make_sets(0)[0][0][0][None]  # one window of token ids, as a run's first batch of one


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CMDARE_HOME=str(tmp_path), PYTHONPATH=str(PROJECT), PYTHONWARNINGS="ignore")
    return subprocess.run([CMDARE, *args], capture_output=True, text=True, env=env, timeout=180)


def _decoder_flops() -> int:
    return BPTT * VOCAB * (2 * WIDTH + 1)


def test_an_lstm_on_token_ids_is_traced_with_its_datas_dtype_and_counts_its_recurrence():
    from wordlm.model import build_lstm

    p = profile_model(build_lstm(), (BPTT,), sample=_ids())
    lstm = BPTT * 2 * (2 * 4 * WIDTH * (WIDTH + WIDTH) + 2 * 4 * WIDTH)  # 2 layers, 4 gates, biases
    assert p.basis == "meta" and p.flops_per_sample_forward == lstm + _decoder_flops()
    by_path = profile_model("wordlm.model:build_lstm", (BPTT,))  # no data: int64 ids after float32 failed
    assert by_path.flops_per_sample_forward == p.flops_per_sample_forward and by_path.basis == "meta"


def test_a_causal_transformer_is_counted_on_a_real_sample_and_leaves_model_and_rng_alone():
    from wordlm.model import build_transformer

    model = build_transformer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    p = profile_model(model, (BPTT,), sample=_ids())
    assert torch.equal(torch.rand(2), expected)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and model.training
    attention = BPTT * WIDTH * (2 * WIDTH + 1) * 4 + 2 * 2 * BPTT * BPTT * WIDTH  # q, k, v, out; scores, sum
    feed_forward = BPTT * 64 * (2 * WIDTH + 1) + BPTT * WIDTH * (2 * 64 + 1)
    assert p.basis == "sample" and p.flops_per_sample_forward == 2 * (attention + feed_forward) + _decoder_flops()
    assert profile_model("wordlm.model:build_transformer", (BPTT,)).basis == "zeros"


def test_layers_counted_by_formula_agree_with_torchs_counter_on_the_meta_device():
    """A GRU, a batch-first attention layer and functional attention: our formulas equal torch's matrix products,
    biases aside."""
    from torch.utils.flop_counter import FlopCounterMode

    gru = nn.GRU(10, 16, num_layers=2, bias=False, bidirectional=True)
    x = torch.empty(7, 1, 10, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        gru.to("meta")(x)
    assert count_forward(gru, x) == counter.get_total_flops() == 7 * 2 * (2 * 3 * 16 * (10 + 16)
                                                                           + 2 * 3 * 16 * (32 + 16))
    attention = nn.MultiheadAttention(16, 2, bias=False, batch_first=True)
    kv = torch.randn(1, 9, 16)

    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = attention

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attention(x[:, :5], x, x, need_weights=False)[0]

    flops = count_forward(Cross(), kv)
    assert flops == 5 * 16 * 2 * 16 + 2 * 9 * 16 * 2 * 16 + 2 * 2 * 5 * 9 * 16 + 5 * 16 * 2 * 16

    class Functional(nn.Module):  # attention called directly: torch counts it on meta, we on a real CPU sample
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)

    heads = torch.randn(1, 2, 12, 16)
    assert count_forward(Functional(), heads) == count_forward(Functional(), heads.to("meta")) == 8 * 12 * 12 * 16


def test_a_model_that_cannot_be_profiled_raises_one_line_naming_what_failed():
    from mypkg.faults import build_locked

    with pytest.raises(ProfileError) as err:
        profile_model(build_locked(), (8,), sample=torch.zeros(1, 8))
    assert "its forward pass fails on a real sample of its data (TypeError: cannot pickle" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("model", "basis", "note"), [
    ("wordlm.model:build_lstm", "meta", None),
    ("wordlm.model:build_transformer", "sample", "its FLOPs were counted on a real sample of its data"),
])
def test_a_run_of_a_language_model_gets_its_profile_and_says_which(model, basis, note, capsys):
    from cmdare.predict.workloads import WorkloadFeatures
    from cmdare.train import TrainSpec
    from cmdare.train.run.controller_setup import run_workload

    spec = TrainSpec(model=model, dataset="wordlm.data:make_sets", loss="wordlm.data:nll", workers=2)
    workload, measured_s = run_workload(spec)
    assert isinstance(workload, WorkloadFeatures) and workload.model_flops > 0 and measured_s is None
    err = capsys.readouterr().err
    assert (note in err and err.count("note:") == 1) if note else "note:" not in err


def test_a_run_of_a_model_that_cannot_be_profiled_measures_its_step_time_and_says_so(capsys):
    from cmdare.control import RevocationPlan
    from cmdare.train import TrainSpec
    from cmdare.train.run.controller_setup import EmulatedStepTimes, _step_times

    spec = TrainSpec(model="mypkg.faults:build_locked", dataset="mypkg.tasks:vectors", loss="mypkg.tasks:mse",
                     workers=2)
    times = _step_times(spec, RevocationPlan.parse("none"))
    assert isinstance(times, EmulatedStepTimes) and 0 < times["k80"] == times["v100"] < 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: --model mypkg.faults:build_locked cannot be profiled (")
    assert "its step time was measured instead" in err[0]


def test_predict_names_what_failed_and_works_with_the_right_shape(tmp_path):
    res = _cli(tmp_path, "predict", "step-time", "--model", "wordlm.model:build_transformer", "--gpu", "v100")
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert "cannot profile it on input of shape 3,32,32: its forward pass fails on a real" in res.stderr
    assert "t() expects a tensor with <= 2 dimensions" in res.stderr and "--input-shape" in res.stderr
    for args in (["predict", "step-time", "--gpu", "v100"], ["workloads", "--format", "json"]):
        res = _cli(tmp_path, *args, "--model", "wordlm.model:build_transformer", "--input-shape", str(BPTT))
        assert res.returncode == 0, res.stderr
