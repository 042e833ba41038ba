"""The built-in model families as data: names and shapes, with no torch (the CLI checks a model name before it
imports torch; :mod:`cmdare.workloads.resnet` and :mod:`cmdare.workloads.shake_shake` build them)."""

from __future__ import annotations

__all__ = ["CUSTOM_RESNETS", "EXTRA_MODELS", "HE_RESNETS", "MEASURED_AS", "SHAKE_SHAKE_WIDTHS", "T2T_WIDTHS",
           "builtin_model_names", "describe_builtin"]

# name -> blocks per stage (He style, widths 16/32/64).
HE_RESNETS: dict[str, tuple[int, int, int]] = {
    "resnet8": (1, 1, 1),
    "resnet15": (2, 2, 2),
    "resnet20": (3, 3, 3),
    "resnet32": (5, 5, 5),
    "resnet56": (9, 9, 9),
}
T2T_WIDTHS = (32, 64, 128)
# name -> (blocks per stage, stage widths), T2T style. 1..8 solved exactly from the CM-DARE data's
# parameter and tensor counts (each has a unique solution at widths 32/64/128); 9 and 10 are our
# extension along the width axis (not in the CM-DARE data).
CUSTOM_RESNETS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "t2t_resnet15": ((2, 2, 2), T2T_WIDTHS),
    "t2t_resnet32": ((5, 5, 5), T2T_WIDTHS),
    "custom_resnet1": ((2, 3, 3), T2T_WIDTHS),
    "custom_resnet2": ((2, 5, 3), T2T_WIDTHS),
    "custom_resnet3": ((3, 8, 3), T2T_WIDTHS),
    "custom_resnet4": ((7, 7, 7), T2T_WIDTHS),
    "custom_resnet5": ((8, 9, 9), T2T_WIDTHS),
    "custom_resnet6": ((10, 13, 12), T2T_WIDTHS),
    "custom_resnet7": ((14, 15, 15), T2T_WIDTHS),
    "custom_resnet8": ((16, 20, 16), T2T_WIDTHS),
    "custom_resnet9": ((2, 2, 2), (64, 128, 256)),
    "custom_resnet10": ((5, 5, 5), (64, 128, 256)),
}

# name -> base width w (the "2x{w}d"). small = 32 and large = 96 match the CM-DARE data (Shake small:
# 2,926,986 parameters; Shake Large / "shakebig": 26,204,362) and Tensor2Tensor's hparams.
SHAKE_SHAKE_WIDTHS: dict[str, int] = {
    "shake_shake_small": 32,
    "shake_shake_mid": 64,
    "shake_shake_large": 96,
    "shake_shake_16": 16,
    "shake_shake_32": 32,
    "shake_shake_48": 48,
    "shake_shake_64": 64,
    "shake_shake_80": 80,
    "shake_shake_96": 96,
}

# The networks the CM-DARE data measured, by their zoo name -> the data's name (the zoo reproduces their
# parameter and tensor counts exactly; cmdare.predict uses their measured features).
MEASURED_AS: dict[str, str] = {
    "t2t_resnet15": "Res15",
    "t2t_resnet32": "Res32",
    **{f"custom_resnet{i}": f"custom{i}" for i in range(1, 9)},
    "shake_shake_16": "shake16",
    "shake_shake_small": "shakesmall",
    "shake_shake_32": "shakesmall",
    "shake_shake_48": "shake48",
    "shake_shake_mid": "shakemid",
    "shake_shake_64": "shakemid",
    "shake_shake_80": "shake80",
    "shake_shake_large": "shakebig",
    "shake_shake_96": "shakebig",
}

# Built outside the families above (cmdare.workloads.resnet_fc, cmdare.workloads.resnet_imagenet).
EXTRA_MODELS: tuple[str, ...] = ("resnet8_fc", "resnet18", "resnet50")


def builtin_model_names() -> list[str]:
    """Every built-in model name, in the zoo's registration order."""
    return [*HE_RESNETS, *CUSTOM_RESNETS, *SHAKE_SHAKE_WIDTHS, *EXTRA_MODELS]


def describe_builtin(name: str) -> str:
    """The one-line description of built-in model ``name``."""
    if name in HE_RESNETS:
        blocks = HE_RESNETS[name]
        title = f"ResNet-{6 * blocks[0] + 2}" if name != "resnet15" else "ResNet-15 (T2T's name; 14 layers)"
        return f"{title}, He et al. CIFAR, {blocks[0]} blocks/stage, 16/32/64 ch"
    if name in CUSTOM_RESNETS:
        blocks, widths = CUSTOM_RESNETS[name]
        origin = "CM-DARE/T2T" if widths == T2T_WIDTHS else "cmdare width extension"
        return f"pre-act ResNet, blocks {'/'.join(map(str, blocks))}, {'/'.join(map(str, widths))} ch ({origin})"
    if name in SHAKE_SHAKE_WIDTHS:
        return f"Shake-Shake-26 2x{SHAKE_SHAKE_WIDTHS[name]}d"
    if name == "resnet8_fc":
        return "ResNet-8 trunk + Linear(4096, 1024) head: one 4.2M-parameter tensor among small ones (PS " \
               "load-balancing benchmarks)"
    if name == "resnet18":
        return "ResNet-18, CIFAR stem (3x3, no pool), BasicBlocks 2/2/2/2, 64-512 ch, 11.2M parameters (Gavel's)"
    if name == "resnet50":
        return "ResNet-50 (torchvision layout), ImageNet stem, bottlenecks 3/4/6/3; train at --input-shape 3,224,224"
    raise KeyError(name)
