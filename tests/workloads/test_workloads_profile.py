"""The profiler: FLOP counts, tensor figures and checkpoint bytes are consistent and match references."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.workloads import WorkloadProfile, build_model, count_flops_forward, profile_model

# The CM-DARE data's figures for Tensor2Tensor's models: training "Model FLOPs" per sample
# (speed_data/0latency_data.csv) and "Number of Tensors" (checkpoint/ckpt.csv).
CMDARE_FLOPS_TENSORS = {
    "t2t_resnet15": (630_989_589, 50),
    "t2t_resnet32": (1_658_696_889, 104),
    "custom_resnet1": (860_117_021, 62),
    "custom_resnet2": (1_087_710_757, 74),
    "custom_resnet3": (1_542_543_029, 98),
    "custom_resnet4": (2_343_835_089, 140),
    "custom_resnet5": (2_915_531_621, 170),
    "custom_resnet6": (3_943_594_121, 224),
    "custom_resnet7": (4_970_946_221, 278),
    "custom_resnet8": (5_882_144_461, 326),
    "shake_shake_16": (663_908_170, 210),
    "shake_shake_small": (2_587_431_950, 216),
    "shake_shake_48": (5_768_251_646, 216),
    "shake_shake_mid": (10_208_089_582, 216),
    "shake_shake_80": (15_906_945_758, 216),
    "shake_shake_large": (22_864_820_174, 216),
}


@pytest.mark.parametrize("name", ["resnet8", "resnet32", "custom_resnet3", "shake_shake_16"])
def test_profile_figures_are_consistent(name: str) -> None:
    p = profile_model(name)
    model = build_model(name)
    params = list(model.parameters())
    assert p.name == name and p.input_shape == (3, 32, 32) and p.num_classes == 10
    assert p.num_params == sum(t.numel() for t in params)
    assert p.num_tensors == len(params)
    assert p.avg_tensor_mb * p.num_tensors * 2**20 == pytest.approx(4 * p.num_params)
    assert p.max_tensor_mb * 2**20 == max(4 * t.numel() for t in params)
    # The state dict also holds BN running statistics and pickle overhead: a few percent over 4 B/param.
    assert 4 * p.num_params < p.checkpoint_bytes < 1.1 * 4 * p.num_params + 100_000
    assert p.flops_per_sample_train == 3 * p.flops_per_sample_forward > 0


def test_flops_match_the_literature() -> None:
    # He et al. ResNet-20/32: about 41M and 69M multiply-adds per 32x32 image.
    assert profile_model("resnet20").flops_per_sample_forward == pytest.approx(2 * 40.8e6, rel=0.03)
    assert profile_model("resnet32").flops_per_sample_forward == pytest.approx(2 * 69.1e6, rel=0.03)


@pytest.mark.parametrize("name", sorted(CMDARE_FLOPS_TENSORS))
def test_t2t_models_match_cmdare_flops_and_tensor_counts(name: str) -> None:
    flops, tensors = CMDARE_FLOPS_TENSORS[name]
    p = profile_model(name)
    assert p.num_tensors == tensors
    # T2T's count also includes activations and additions; ours is 0.6-1.7% lower.
    assert p.flops_per_sample_train == pytest.approx(flops, rel=0.02)
    assert 0.98 * flops < p.flops_per_sample_train <= flops


def test_tensor_sizes_match_cmdare_data() -> None:
    # 0latency_data.csv: average / max tensor size (MB) of ResNet-15, ResNet-32 and Shake-Shake big.
    for name, avg_mb, max_mb in (("t2t_resnet15", 0.052934113, 0.5625), ("t2t_resnet32", 0.068140837, 0.5625),
                                 ("shake_shake_large", 0.462785686, 5.0625)):  # fmt: skip
        p = profile_model(name)
        assert p.avg_tensor_mb == pytest.approx(avg_mb, rel=1e-6) and p.max_tensor_mb == max_mb


def test_flops_scale_with_input_area() -> None:
    small, big = profile_model("resnet20", (3, 16, 16)), profile_model("resnet20", (3, 32, 32))
    assert big.flops_per_sample_forward / small.flops_per_sample_forward == pytest.approx(4, rel=0.01)
    assert big.num_params == small.num_params


def test_hook_count_agrees_with_torch_flop_counter() -> None:
    # Conv and linear without bias, plus one BN: ours = torch's matmul/conv count + 2 per BN element.
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * 10 * 10, 5, bias=False),
    ).eval()  # fmt: skip
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 3, 10, 10))
    assert count_flops_forward(model, (3, 10, 10)) == counter.get_total_flops() + 2 * 8 * 10 * 10
    # A whole ResNet: BN and biases add well under 2% to torch's conv/matmul count.
    resnet = build_model("resnet20").eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        resnet(torch.randn(1, 3, 32, 32))
    ours = profile_model("resnet20").flops_per_sample_forward
    assert counter.get_total_flops() < ours < 1.02 * counter.get_total_flops()


def test_profiles_are_cached_and_leave_the_rng_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    first = profile_model("resnet15", (3, 9, 9))
    assert torch.equal(torch.rand(3), expected)
    assert profile_model("resnet15", (3, 9, 9)) is first
    assert profile_model("resnet15", [3, 10, 9]) is not first
    assert profile_model("resnet15", (1, 9, 9)).num_params < first.num_params


def test_profile_of_a_module_leaves_it_usable() -> None:
    model = build_model("resnet8", in_channels=1)
    p = profile_model(model, (1, 8, 8))
    assert isinstance(p, WorkloadProfile) and p.name == "CifarResNet"
    assert all(t.device.type == "cpu" for t in model.parameters())
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    assert buf.getbuffer().nbytes == p.checkpoint_bytes


def test_to_dict_is_json_ready_and_profile_is_frozen() -> None:
    p = profile_model("resnet8", (1, 8, 8))
    d = json.loads(json.dumps(p.to_dict()))
    assert d["input_shape"] == [1, 8, 8] and d["num_params"] == p.num_params
    assert set(d) >= {"flops_per_sample_forward", "flops_per_sample_train", "num_tensors", "avg_tensor_mb",
                      "max_tensor_mb", "checkpoint_bytes"}  # fmt: skip
    with pytest.raises(AttributeError):
        p.num_params = 1  # type: ignore[misc]


@pytest.mark.parametrize("shape", [(3, 32), (3, 4, 4), (0, 8, 8), ("a", 8, 8), 5])
def test_bad_input_shape(shape: object) -> None:
    with pytest.raises(UserInputError):
        profile_model("resnet8", shape)  # type: ignore[arg-type]


def test_unknown_model() -> None:
    with pytest.raises(UnknownNameError):
        profile_model("vgg16")
