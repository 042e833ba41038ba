"""resnet8_fc: the skewed-tensor benchmark model (one 16 MiB tensor among small ones)."""

from __future__ import annotations

import torch

from cmdare.workloads import build_model


def test_resnet8_fc_has_one_dominant_tensor_and_fixed_features() -> None:
    torch.manual_seed(0)
    model = build_model("resnet8_fc", num_classes=10, in_channels=1)
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    assert sizes["fc.0.weight"] == 4096 * 1024
    assert sum(sizes.values()) == 4_279_930
    assert sizes["fc.0.weight"] / sum(sizes.values()) > 0.97
    assert sorted(sizes.values())[-2] < 40_000  # every other tensor is small
    for side in (8, 32):  # digits (8x8) and CIFAR-sized inputs reach the same 64x8x8 features
        assert model(torch.randn(2, 1, side, side)).shape == (2, 10)
