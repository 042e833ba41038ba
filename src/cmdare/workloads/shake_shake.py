"""Shake-Shake regularised ResNets (Gastaldi 2017), "Shake-Shake-26 2x{width}d", in plain ``torch.nn``.

Structure as in the paper and Tensor2Tensor's ``shake_shake``: a 3x3 stem of 16 channels + BN, three
stages of 4 blocks with widths ``w, 2w, 4w`` (26 weighted layers: 2 + 3 * 4 * 2), each block the sum
of a shortcut and a random convex mix of two ReLU-Conv-BN-ReLU-Conv-BN branches, a final ReLU,
global average pooling and a linear classifier. Where the shape changes, the shortcut is the paper's
two-path one: 1x1 average pooling with stride 2 of ``x`` and of ``x`` shifted by one pixel, a 1x1
conv to ``width / 2`` each, concatenated and batch-normalised. Every convolution carries a bias, as
in Tensor2Tensor (``tf.layers.conv2d`` default), which reproduces the CM-DARE data's parameter counts.

Mixing ("Shake-Shake-Image"): each sample draws ``alpha ~ U(0, 1)`` for the forward pass and an
independent ``beta ~ U(0, 1)`` for the backward pass, both from torch's global RNG at forward time
(so a seeded run is reproducible); in eval mode both are 0.5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cmdare.workloads.families import SHAKE_SHAKE_WIDTHS

__all__ = ["SHAKE_SHAKE_WIDTHS", "ShakeShakeNet"]

class _ShakeMix(torch.autograd.Function):
    """``alpha * a + (1 - alpha) * b`` forward; gradients scaled by ``beta`` / ``1 - beta``."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor):  # type: ignore[override]
        ctx.save_for_backward(beta)
        return alpha * a + (1 - alpha) * b

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (beta,) = ctx.saved_tensors
        return beta * grad, (1 - beta) * grad, None, None


def _branch(in_ch: int, out_ch: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.ReLU(inplace=False),
        nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_ch, out_ch, 3, padding=1),
        nn.BatchNorm2d(out_ch),
    )


class _Shortcut(nn.Module):
    """The two-path shortcut used where channels or resolution change."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv1 = nn.Conv2d(in_ch, out_ch // 2, 1)
        self.conv2 = nn.Conv2d(in_ch, out_ch - out_ch // 2, 1)
        self.bn = nn.BatchNorm2d(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        p1 = F.avg_pool2d(x, 1, self.stride)
        p2 = F.avg_pool2d(F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1)), 1, self.stride)
        return self.bn(torch.cat([self.conv1(p1), self.conv2(p2)], dim=1))


class _ShakeBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.branch1 = _branch(in_ch, out_ch, stride)
        self.branch2 = _branch(in_ch, out_ch, stride)
        self.shortcut: nn.Module = (
            nn.Identity() if (in_ch == out_ch and stride == 1) else _Shortcut(in_ch, out_ch, stride)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.branch1(x), self.branch2(x)
        if self.training:
            # Draw both coefficients every training step, grad or not, so the RNG stream is the same.
            shape = (x.shape[0], 1, 1, 1)
            alpha = torch.rand(shape, device=x.device, dtype=x.dtype)
            beta = torch.rand(shape, device=x.device, dtype=x.dtype)
            mixed = _ShakeMix.apply(a, b, alpha, beta) if torch.is_grad_enabled() else alpha * a + (1 - alpha) * b
        else:
            mixed = 0.5 * (a + b)
        return self.shortcut(x) + mixed


class ShakeShakeNet(nn.Module):
    """Shake-Shake-``depth`` ``2x{width}d``.

    Args:
        width: base width ``w`` (stages have ``w, 2w, 4w`` channels).
        num_classes: classifier outputs.
        in_channels: input image channels.
        depth: ``6n + 2`` weighted layers (26 gives 4 blocks per stage).
    """

    def __init__(self, width: int = 32, num_classes: int = 10, in_channels: int = 3, depth: int = 26):
        super().__init__()
        if (depth - 2) % 6 or depth < 8:
            raise ValueError(f"depth must be 6n + 2 with n >= 1, got {depth}")
        if width < 2 or width % 2:
            raise ValueError(f"width must be an even number >= 2, got {width}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, padding=1), nn.BatchNorm2d(16))
        blocks: list[nn.Module] = []
        in_ch = 16
        for stage, out_ch in enumerate((width, 2 * width, 4 * width)):
            for i in range(n):
                blocks.append(_ShakeBlock(in_ch, out_ch, 2 if (stage > 0 and i == 0) else 1))
                in_ch = out_ch
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and not m.weight.is_meta:  # meta: profiling, no values
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))
