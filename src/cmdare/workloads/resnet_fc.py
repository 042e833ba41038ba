"""``resnet8_fc``: ResNet-8's conv trunk with a large fully connected head (skewed tensor sizes).

A benchmark model for parameter-server load balancing: the He-style ResNet-8 trunk (16/32/64
channels, 74k parameters in 21 small tensors) without global pooling; its 64-channel feature map is
brought to 8x8 by adaptive average pooling (the identity on 32x32 inputs; on 8x8 digits the 2x2 map
is spread over 8x8), flattened to 4,096 features and fed to ``Linear(4096, 1024) -> ReLU ->
Linear(1024, classes)``. One tensor (``fc.0.weight``, 4,194,304 values, 16 MiB) holds 98% of the
4.28M parameters, so on CPU the parameter shards, not the workers' compute, bound the step rate, and
a placement that splits bytes evenly is the natural static baseline.
"""

from __future__ import annotations

from torch import nn

from cmdare.workloads.resnet import CifarResNet

FC_SPATIAL = 8
FC_HIDDEN = 1024


def resnet8_fc(num_classes: int, in_channels: int) -> nn.Module:
    """ResNet-8 trunk, 64x8x8 flattened features, ``Linear(4096, 1024) -> ReLU -> Linear(1024, classes)``."""
    model = CifarResNet((1, 1, 1), (16, 32, 64), num_classes, in_channels, style="he")
    features = 64 * FC_SPATIAL * FC_SPATIAL
    model.pool = nn.AdaptiveAvgPool2d(FC_SPATIAL)
    model.fc = nn.Sequential(nn.Linear(features, FC_HIDDEN), nn.ReLU(inplace=True),
                             nn.Linear(FC_HIDDEN, num_classes))
    return model
