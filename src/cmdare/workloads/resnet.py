"""ResNet-CIFAR family in plain ``torch.nn``.

Two block styles, both with 3 stages and global average pooling (so any input >= 8x8 works):

* **He et al. 2016, CIFAR variant** (``resnet8/14/15/20/32/56``): post-activation BasicBlock, a 3x3
  stem of 16 channels, stages of 16/32/64 channels with ``n`` blocks each (depth ``6n + 2``), and
  parameter-free option-A shortcuts (stride-2 subsampling plus zero channel padding). ResNet-20 has
  0.27M and ResNet-32 0.46M parameters, as in the paper's Table 6.
* **Tensor2Tensor ``resnet_cifar_*``** (``t2t_resnet15/32`` and ``custom_resnet1..10``), the networks
  the CM-DARE measurements were taken on: pre-activation blocks (v2), a 7x7 stem of 16 channels,
  stages of 32/64/128 channels and a 1x1-conv + BN projection on the first block of every stage.
  With the block counts below these reproduce the CM-DARE data's parameter and tensor counts
  exactly (ResNet-15 693,818 / 50; ResNet-32 1,857,722 / 104; Custom ResNet 1..8 as in
  ``checkpoint/ckpt.csv``); the profiler's training FLOPs are 0.6-1.7% below T2T's figures.

``resnet15``: Tensor2Tensor names ``resnet_cifar_15`` a network with 2 blocks per stage, i.e. 6*2+2 = 14
weighted layers on the main path; we keep that realisation (2 blocks per stage, He style) and the name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cmdare.workloads.families import CUSTOM_RESNETS, HE_RESNETS, T2T_WIDTHS

__all__ = ["CUSTOM_RESNETS", "CifarResNet", "HE_RESNETS", "T2T_WIDTHS"]

def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)


class _HeBlock(nn.Module):
    """Post-activation BasicBlock with an option-A (parameter-free) shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(in_ch, out_ch, stride), nn.BatchNorm2d(out_ch)
        self.conv2, self.bn2 = _conv3x3(out_ch, out_ch), nn.BatchNorm2d(out_ch)
        self.stride, self.pad_ch = stride, out_ch - in_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad_ch:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.pad_ch))
        return F.relu(out + shortcut)


class _PreActBlock(nn.Module):
    """Pre-activation block as in Tensor2Tensor's ``residual_block`` (projection = 1x1 conv + BN)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(in_ch), _conv3x3(in_ch, out_ch, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(out_ch), _conv3x3(out_ch, out_ch)
        self.proj: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.proj = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        shortcut = self.proj(pre) if self.proj is not None else x
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class CifarResNet(nn.Module):
    """A 3-stage CIFAR ResNet.

    Args:
        blocks: residual blocks per stage, e.g. ``(5, 5, 5)`` for ResNet-32.
        widths: channels per stage, e.g. ``(16, 32, 64)``.
        num_classes: classifier outputs.
        in_channels: input image channels.
        style: ``"he"`` (post-activation, option-A shortcuts, 3x3 stem) or ``"t2t"`` (pre-activation,
            projection shortcuts, 7x7 stem), see the module docstring.
        stem_width: channels of the stem convolution.
    """

    def __init__(
        self,
        blocks: tuple[int, int, int],
        widths: tuple[int, int, int] = (16, 32, 64),
        num_classes: int = 10,
        in_channels: int = 3,
        style: str = "he",
        stem_width: int = 16,
    ):
        super().__init__()
        if style not in ("he", "t2t"):
            raise ValueError(f"style must be 'he' or 't2t', got {style!r}")
        if len(blocks) != 3 or len(widths) != 3 or min(blocks) < 1 or min(widths) < 1:
            raise ValueError(f"need 3 stages with >= 1 block and width, got {blocks} / {widths}")
        kernel = 3 if style == "he" else 7
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_width, kernel, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(stem_width),
            nn.ReLU(inplace=True),
        )
        block_cls = _HeBlock if style == "he" else _PreActBlock
        layers: list[nn.Module] = []
        in_ch = stem_width
        for stage, (n, width) in enumerate(zip(blocks, widths, strict=True)):
            for i in range(n):
                layers.append(block_cls(in_ch, width, 2 if (stage > 0 and i == 0) else 1))
                in_ch = width
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        self.style = style
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and not m.weight.is_meta:  # meta: profiling, no values
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        if self.style == "t2t":
            out = F.relu(out)
        return self.fc(torch.flatten(self.pool(out), 1))
