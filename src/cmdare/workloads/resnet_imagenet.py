"""The ResNets of today's benchmarks in plain ``torch.nn``: ResNet-18 for CIFAR and ResNet-50 for ImageNet.

* ``resnet18``: ResNet-18 as trained on CIFAR-10 by most PyTorch code (and by Gavel's measurements,
  ``stanford-futuredata/gavel``): a 3x3 stem of 64 channels, no max-pool, BasicBlocks 2/2/2/2 over 64/128/256/512
  channels with 1x1-conv + BN projections; 11.17 M parameters at 10 classes.
* ``resnet50``: He et al.'s ResNet-50 (torchvision's layout, v1.5: the stride on the 3x3 conv of a bottleneck): a
  7x7 stem of 64 channels and a max-pool, bottlenecks 3/4/6/3 with expansion 4; 25.56 M parameters at 1000 classes,
  4.1 GMACs forward per 224x224 image. Train it on 224x224 inputs (``--input-shape 3,224,224``) to match the
  published figures.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["ImageResNet", "resnet18_cifar", "resnet50_imagenet"]


def _bn_conv(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(out_ch))


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(_bn_conv(in_ch, width, 3, stride), nn.ReLU(inplace=True), _bn_conv(width, width, 3))
        out = width * self.expansion
        self.shortcut = _bn_conv(in_ch, out, 1, stride) if stride != 1 or in_ch != out else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        out = width * self.expansion
        self.body = nn.Sequential(_bn_conv(in_ch, width, 1), nn.ReLU(inplace=True), _bn_conv(width, width, 3, stride),
                                  nn.ReLU(inplace=True), _bn_conv(width, out, 1))
        self.shortcut = _bn_conv(in_ch, out, 1, stride) if stride != 1 or in_ch != out else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ImageResNet(nn.Module):
    """A four-stage ResNet (widths 64/128/256/512) with a CIFAR (3x3, no pool) or ImageNet (7x7 + max-pool) stem."""

    def __init__(self, block: type[_Basic] | type[_Bottleneck], blocks: tuple[int, int, int, int], num_classes: int,
                 in_channels: int, stem: str):
        super().__init__()
        if stem == "cifar":
            self.stem = nn.Sequential(_bn_conv(in_channels, 64, 3), nn.ReLU(inplace=True))
        else:
            self.stem = nn.Sequential(_bn_conv(in_channels, 64, 7, 2), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, stride=2, padding=1))
        layers, ch = [], 64
        for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
            for i in range(n):
                layers.append(block(ch, width, 2 if stage > 0 and i == 0 else 1))
                ch = width * block.expansion
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


def resnet18_cifar(num_classes: int = 10, in_channels: int = 3) -> ImageResNet:
    """ResNet-18, CIFAR stem (11.17 M parameters at 10 classes)."""
    return ImageResNet(_Basic, (2, 2, 2, 2), num_classes, in_channels, stem="cifar")


def resnet50_imagenet(num_classes: int = 1000, in_channels: int = 3) -> ImageResNet:
    """ResNet-50, ImageNet stem (25.56 M parameters at 1000 classes)."""
    return ImageResNet(_Bottleneck, (3, 4, 6, 3), num_classes, in_channels, stem="imagenet")
