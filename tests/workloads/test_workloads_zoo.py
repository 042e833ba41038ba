"""The model zoo: every model builds and trains a step; sizes match the papers and the CM-DARE data."""

from __future__ import annotations

import pytest
import torch

import cmdare.workloads as wl
from cmdare.errors import UnknownNameError, UserInputError
from cmdare.workloads import build_model, list_models, register_model, unregister_model
from cmdare.workloads.shake_shake import _ShakeMix

REQUIRED = [
    "resnet8", "resnet15", "resnet20", "resnet32", "resnet56",
    *[f"custom_resnet{i}" for i in range(1, 11)],
    "shake_shake_small", "shake_shake_mid", "shake_shake_large",
    "shake_shake_16", "shake_shake_32", "shake_shake_48", "shake_shake_80",
]  # fmt: skip

# Parameter counts of the CM-DARE data (cmdare/public_data/cmdare/checkpoint/ckpt.csv, Tensor2Tensor's models).
CMDARE_PARAMS = {
    "t2t_resnet15": 693_818,
    "t2t_resnet32": 1_857_722,
    "custom_resnet1": 1_063_226,
    "custom_resnet2": 1_211_194,
    "custom_resnet3": 1_451_706,
    "custom_resnet4": 2_633_658,
    "custom_resnet5": 3_391_034,
    "custom_resnet6": 4_610_362,
    "custom_resnet7": 5_718_842,
    "custom_resnet8": 6_421_306,
    "shake_shake_16": 737_418,
    "shake_shake_small": 2_926_986,
    "shake_shake_48": 6_568_282,
    "shake_shake_mid": 11_661_610,
    "shake_shake_80": 18_206_970,
    "shake_shake_large": 26_204_362,
}


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_public_api_is_pinned() -> None:
    assert set(wl.__all__) == {
        "ModelSpec", "WorkloadProfile", "build_model", "count_flops_forward", "describe_model",
        "list_models", "profile_model", "register_model", "unregister_model",
    }  # fmt: skip
    assert set(REQUIRED) <= set(list_models())


# Aliases share their builder with the canonical name (checked below), so they are not trained again.
ALIASES = {
    "shake_shake_32": "shake_shake_small",
    "shake_shake_64": "shake_shake_mid",
    "shake_shake_96": "shake_shake_large",
}
TRAINED = [name for name in list_models() if name not in ALIASES]


@pytest.mark.parametrize("name", TRAINED)
def test_every_model_trains_one_step_on_small_input(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, in_channels=3)
    if name in CMDARE_PARAMS:
        assert _num_params(model) == CMDARE_PARAMS[name]
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([1, 6])
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert torch.isfinite(torch.cat([g.flatten() for g in grads])).all()
    assert any(bool(g.any()) for g in grads)


def test_aliases_name_the_same_architecture() -> None:
    for alias, canonical in ALIASES.items():
        assert wl.describe_model(alias) == wl.describe_model(canonical)
    assert "2x96d" in wl.describe_model("shake_shake_large")
    assert "2x64d" in wl.describe_model("shake_shake_mid")


@pytest.mark.parametrize(
    ("name", "in_channels", "size"),
    [("resnet8", 1, 8), ("resnet32", 3, 13), ("resnet15", 3, 32), ("shake_shake_16", 1, 9)],
)
def test_models_accept_any_input_of_at_least_8(name: str, in_channels: int, size: int) -> None:
    model = build_model(name, num_classes=10, in_channels=in_channels).eval()
    with torch.no_grad():
        out = model(torch.randn(3, in_channels, size, size))
    assert out.shape == (3, 10)


def test_he_resnets_have_the_papers_parameter_counts() -> None:
    # He et al. 2016, Table 6: ResNet-20 0.27M, ResNet-32 0.46M, ResNet-56 0.85M parameters.
    for name, expected in (("resnet20", 0.27e6), ("resnet32", 0.46e6), ("resnet56", 0.85e6)):
        assert _num_params(build_model(name)) == pytest.approx(expected, rel=0.02), name
    assert _num_params(build_model("resnet8")) < 100_000


def test_custom_family_grows_in_depth_and_width() -> None:
    counts = [_num_params(build_model(f"custom_resnet{i}")) for i in range(1, 9)]  # the built models, not the table
    assert all(a < b for a, b in zip(counts, counts[1:], strict=False)), counts
    # 9 widens T2T's ResNet-15 to 64/128/256 channels: about 4x the parameters.
    assert _num_params(build_model("custom_resnet9")) == pytest.approx(4 * CMDARE_PARAMS["t2t_resnet15"], rel=0.02)


def test_unknown_name_and_bad_arguments() -> None:
    with pytest.raises(UnknownNameError) as info:
        build_model("resnet33")
    assert "resnet32" in str(info.value) and info.value.kind == "model"
    with pytest.raises(UserInputError):
        build_model("resnet8", num_classes=0)
    with pytest.raises(UserInputError):
        build_model("resnet8", in_channels=-1)


def test_register_model_factory() -> None:
    def tiny(num_classes: int, in_channels: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))

    register_model("test_tiny", tiny, "a test model")
    try:
        assert "test_tiny" in list_models()
        assert wl.describe_model("test_tiny") == "a test model"
        assert build_model("test_tiny", num_classes=4)(torch.zeros(2, 1, 8, 8)).shape == (2, 4)
        with pytest.raises(UserInputError):
            register_model("test_tiny", tiny)
    finally:
        unregister_model("test_tiny")
    assert "test_tiny" not in list_models()


def test_shake_shake_is_reproducible_with_a_seed_and_half_mix_at_eval() -> None:
    model = build_model("shake_shake_16")
    x = torch.randn(4, 3, 8, 8)
    outs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        outs.append(model(x))
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


def test_shake_mix_uses_separate_forward_and_backward_coefficients() -> None:
    a = torch.ones(2, 1, 1, 1, requires_grad=True)
    b = torch.full((2, 1, 1, 1), 3.0, requires_grad=True)
    alpha, beta = torch.full((2, 1, 1, 1), 0.25), torch.full((2, 1, 1, 1), 0.9)
    out = _ShakeMix.apply(a, b, alpha, beta)
    out.sum().backward()
    assert torch.allclose(out, torch.full_like(out, 0.25 * 1 + 0.75 * 3))
    assert torch.allclose(a.grad, torch.full_like(a, 0.9))
    assert torch.allclose(b.grad, torch.full_like(b, 0.1))
