"""Registers the built-in model families (loaded once, on first use, by :mod:`cmdare.workloads.registry`)."""

from __future__ import annotations

from functools import partial

from torch import nn

from cmdare.workloads.resnet import CUSTOM_RESNETS, HE_RESNETS, CifarResNet
from cmdare.workloads.resnet_fc import resnet8_fc
from cmdare.workloads.shake_shake import SHAKE_SHAKE_WIDTHS, ShakeShakeNet
from cmdare.workloads.specs import add_model


def _he(blocks: tuple[int, int, int], num_classes: int, in_channels: int) -> nn.Module:
    return CifarResNet(blocks, (16, 32, 64), num_classes, in_channels, style="he")


def _t2t(blocks: tuple[int, int, int], widths: tuple[int, int, int], num_classes: int, in_channels: int) -> nn.Module:
    return CifarResNet(blocks, widths, num_classes, in_channels, style="t2t")


def _shake(width: int, num_classes: int, in_channels: int) -> nn.Module:
    return ShakeShakeNet(width, num_classes, in_channels, depth=26)


def register_builtin_models() -> None:
    """Register every built-in model name (idempotent)."""
    for name, blocks in HE_RESNETS.items():
        depth = 6 * blocks[0] + 2
        title = f"ResNet-{depth}" if name != "resnet15" else "ResNet-15 (T2T's name; 14 layers)"
        add_model(
            name,
            partial(_he, blocks),
            f"{title}, He et al. CIFAR, {blocks[0]} blocks/stage, 16/32/64 ch",
        )
    for name, (blocks, widths) in CUSTOM_RESNETS.items():
        origin = "CM-DARE/T2T" if widths == (32, 64, 128) else "cmdare width extension"
        blocks_s, widths_s = "/".join(map(str, blocks)), "/".join(map(str, widths))
        add_model(
            name,
            partial(_t2t, blocks, widths),
            f"pre-act ResNet, blocks {blocks_s}, {widths_s} ch ({origin})",
        )
    for name, width in SHAKE_SHAKE_WIDTHS.items():
        add_model(name, partial(_shake, width), f"Shake-Shake-26 2x{width}d")
    add_model("resnet8_fc", resnet8_fc, "ResNet-8 trunk + Linear(4096, 1024) head: one 4.2M-parameter "
              "tensor among small ones (PS load-balancing benchmarks)")
