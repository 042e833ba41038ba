"""Registers the built-in model families (loaded once, on first use, by :mod:`cmdare.workloads.registry`)."""

from __future__ import annotations

from functools import partial

from torch import nn

from cmdare.workloads.families import (
    CUSTOM_RESNETS,
    HE_RESNETS,
    SHAKE_SHAKE_WIDTHS,
    builtin_model_names,
    describe_builtin,
)
from cmdare.workloads.resnet import CifarResNet
from cmdare.workloads.resnet_fc import resnet8_fc
from cmdare.workloads.resnet_imagenet import resnet18_cifar, resnet50_imagenet
from cmdare.workloads.shake_shake import ShakeShakeNet
from cmdare.workloads.specs import add_model


def _he(blocks: tuple[int, int, int], num_classes: int, in_channels: int) -> nn.Module:
    return CifarResNet(blocks, (16, 32, 64), num_classes, in_channels, style="he")


def _t2t(blocks: tuple[int, int, int], widths: tuple[int, int, int], num_classes: int, in_channels: int) -> nn.Module:
    return CifarResNet(blocks, widths, num_classes, in_channels, style="t2t")


def _shake(width: int, num_classes: int, in_channels: int) -> nn.Module:
    return ShakeShakeNet(width, num_classes, in_channels, depth=26)


def register_builtin_models() -> None:
    """Register every built-in model name (idempotent)."""
    builders = {name: partial(_he, blocks) for name, blocks in HE_RESNETS.items()}
    builders |= {name: partial(_t2t, blocks, widths) for name, (blocks, widths) in CUSTOM_RESNETS.items()}
    builders |= {name: partial(_shake, width) for name, width in SHAKE_SHAKE_WIDTHS.items()}
    builders["resnet8_fc"] = resnet8_fc
    builders["resnet18"] = resnet18_cifar
    builders["resnet50"] = resnet50_imagenet
    for name in builtin_model_names():
        add_model(name, builders[name], describe_builtin(name), builtin=True)
