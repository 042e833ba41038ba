"""The cross-generation step-time model (issue 45, item 1): data, profiles, held-out checks and precision."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.gpu_specs import gpu_spec
from cmdare.errors import UserInputError
from cmdare.predict.generation_data import training_rows
from cmdare.predict.generation_eval import generation_errors, held_out_v100
from cmdare.predict.generations import generation_step_model, precision_factor, roofline_terms
from cmdare.predict.op_profile import extra_op_profiles, op_profile_for


def test_training_rows_cover_three_generations_and_two_sources():
    rows = training_rows()
    assert {r.gpu for r in rows} == {"K80", "P100", "V100"}
    assert {r.dataset for r in rows} == {"cmdare", "cmdare-v100", "gavel"}
    assert sum(r.dataset == "cmdare-v100" for r in rows) == 4
    # Gavel's zero (ResNet-50 at 128 on a K80: not measured) is left out
    k80 = [r for r in rows if r.dataset == "gavel" and r.gpu == "K80" and r.model == "ResNet-50"]
    assert 128 not in {r.batch for r in k80}
    assert all(r.step_time_s > 0 and r.profile.flops > 0 for r in rows)


def test_resnet50_profile_counts_three_times_its_forward_macs():
    p = extra_op_profiles()[("resnet50", 64)]
    # 4.1 GMACs forward per 224x224 image: x2 FLOPs per MAC, x3 for forward + backward
    assert p.flops / 64 == pytest.approx(3 * 2 * 4.09e9, rel=0.02)
    assert sum(int(np.prod(s)) for _, s in p.params) == 25_557_032
    assert set(np.unique(p.ops[:, 3])) == {0.0, 1.0, 2.0}  # memory, conv and matmul operators


def test_held_out_v100_of_the_cmdare_networks_within_8_percent():
    check = held_out_v100()
    assert list(check["cnn"]) == ["Res15", "Res32", "shakesmall", "shakebig"]
    assert check["error_pct"].abs().mean() <= 8.0  # 7.47% when written; 15.5% with the model before issue 45


def test_leave_one_out_errors_are_reported_for_every_group_and_dataset():
    errors = generation_errors()
    assert set(errors["protocol"]) == {"in-sample", "leave-one-GPU-out", "leave-one-family-out"}
    logo = errors[errors["protocol"] == "leave-one-GPU-out"]
    assert set(logo["held_out"]) == {"K80", "P100", "V100"}
    lofo = errors[errors["protocol"] == "leave-one-family-out"]
    assert set(lofo["held_out"]) == {"ResNet-18", "ResNet-50", "Shake-Shake (CIFAR)", "T2T ResNet (CIFAR)"}
    assert np.isfinite(errors["mape"]).all() and (errors["n"] > 0).all()


def test_efficiencies_are_fractions_of_the_spec_sheet():
    for compute, memory in generation_step_model().efficiencies().values():
        assert 0 < compute <= 1 and 0 < memory <= 1


def test_convolutions_take_the_tf32_path_from_ampere_on():
    p = extra_op_profiles()[("resnet50", 64)]
    v100, a100 = gpu_spec("V100"), gpu_spec("A100")
    assert a100.tf32_tflops > a100.fp32_tflops and v100.tf32_tflops == v100.fp32_tflops
    comp_v, _ = roofline_terms(p, v100)
    comp_a, _ = roofline_terms(p, a100)
    assert comp_a < comp_v * v100.fp32_tflops / a100.tf32_tflops * 1.5
    model = generation_step_model()
    t = {g: model.predict(p, gpu_spec(g), 25_557_032, 161, parameter_server=False) for g in ("V100", "A100", "H100")}
    assert t["V100"] / t["A100"] > 1.31  # the model before issue 45 said 1.31x at batch 128
    assert t["H100"] < t["A100"]


def test_a_user_resnet50_with_another_head_is_priced_on_the_resnet50_profile():
    from cmdare.predict.op_profile import published_op_profiles

    p = op_profile_for(24.59e9 * 64 / 128, 23_528_522, 161)
    assert len(p.params) == 161 and p.ops.shape[0] == extra_op_profiles()[("resnet50", 64)].ops.shape[0]
    assert p.ops.shape[0] not in {q.ops.shape[0] for q in published_op_profiles().values()}


def test_mixed_precision_speeds_up_where_the_gpu_has_the_path_and_is_refused_where_not():
    p = extra_op_profiles()[("resnet50", 64)]
    assert precision_factor(p, "a100", 25_557_032, 161, "fp32") == 1.0
    assert precision_factor(p, "a100", 25_557_032, 161, "amp-bf16") < 1.0
    assert precision_factor(p, "v100", 25_557_032, 161, "amp-fp16") < 1.0
    with pytest.raises(UserInputError, match="V100 \\(Volta\\) has no bf16"):
        precision_factor(p, "v100", 25_557_032, 161, "amp-bf16")
    with pytest.raises(UserInputError, match="K80 \\(Kepler\\) has no fp16"):
        precision_factor(p, "k80", 25_557_032, 161, "amp-fp16")
    with pytest.raises(UserInputError, match="by name"):
        precision_factor(p, 19.5, 25_557_032, 161, "amp-bf16")


def test_two_ps_runs_predicted_by_the_one_ps_fit():
    from cmdare.predict.two_ps_check import two_ps_errors

    errors = two_ps_errors()
    assert len(errors) == 32 and set(errors["cnn"]) == {"Res15", "Res32", "shakesmall", "shakebig"}
    # the cluster task's protocol (the measured single-GPU step time): 6.16% when written
    assert errors["error_measured_step_pct"].abs().mean() <= 8.0
    # through the predicted step time (what `predict cluster-speed` answers) it is 8.97%: reported, not a target met
    assert errors["error_predicted_step_pct"].abs().mean() < 10.0
