"""GPU mixes such as ``k80:2,p100:1``: parsed once for the performance models and the cluster configs.

:func:`parse_gpu_counts` lives here, beside the catalog that names the GPU types, so that both
:mod:`cmdare.predict` (``predict cluster-speed --gpus``, the ``GPUs`` column of input tables) and
:mod:`cmdare.cloud.launcher` (``cluster-config --workers k80:2,v100:1``) read a mix the same way;
``cmdare.predict.features.parse_gpu_counts`` is this function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cmdare.errors import DataFormatError

if TYPE_CHECKING:
    from cmdare.cloud.catalog_model import Catalog

__all__ = ["parse_gpu_counts"]


def parse_gpu_counts(spec: str | Sequence[str] | Mapping[str, int], catalog: Catalog | None = None) -> dict[str, int]:
    """``"k80:2,p100:1"``, ``["k80", "k80", "p100"]`` or ``{"k80": 2}`` -> ``{"k80": 2, "p100": 1}``.

    A bare name counts one; entries of the same type add up; zero counts are dropped. Keys are lower
    case, in first-seen order.

    Args:
        spec: the mix.
        catalog: the catalog whose GPU types are valid (default: the default catalog).

    Raises:
        DataFormatError: for a malformed entry, a negative count or a mix without GPUs.
        UnknownNameError: for a GPU type the catalog does not know (the message lists them).
    """
    counts: dict[str, int] = {}
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        parts = spec.split(",") if isinstance(spec, str) else list(spec)
        items = []
        for part in parts:
            part = part.strip()
            if not part:
                continue
            name, _, num = part.partition(":")
            try:
                items.append((name, int(num) if num else 1))
            except ValueError as err:
                raise DataFormatError(f"bad GPU count {part!r}; expected e.g. k80:2,p100:1") from err
    for name, num in items:
        _check_gpu(name, catalog)
        if int(num) < 0:
            raise DataFormatError(f"negative GPU count {name}:{num}")
        if int(num) > 0:
            key = name.strip().lower()
            counts[key] = counts.get(key, 0) + int(num)
    if not counts:
        raise DataFormatError(f"no GPUs in {spec!r}; expected e.g. k80:2,p100:1")
    return counts


def _check_gpu(name: str, catalog: Catalog | None) -> None:
    if catalog is not None:
        catalog.gpu(name)
        return
    from cmdare.cloud.catalog_loader import gpu_tflops

    gpu_tflops(name.strip())
