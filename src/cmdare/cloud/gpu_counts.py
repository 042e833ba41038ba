"""GPU mixes such as ``k80:2,p100:1`` and the ``--workers`` option: parsed once, here, for every command.

:func:`parse_gpu_counts` lives here, beside the catalog that names the GPU types, so that
:mod:`cmdare.predict` (the ``GPUs`` column of input tables), :mod:`cmdare.cloud.launcher` and the planner read
a mix the same way; ``cmdare.predict.features.parse_gpu_counts`` is this function. :func:`parse_workers` is
``--workers`` of every command (``train``, ``plan simulate``, ``predict cluster-speed``, ``cluster-config``): a
count (``4``) or a mix (``k80:2,v100:1``). A command that needs a GPU type and is given a bare count uses
:data:`DEFAULT_WORKER_GPU` (``train`` uses its ``--gpu``) and names it in its output (:func:`default_gpu_note`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmdare.errors import DataFormatError, UserInputError

if TYPE_CHECKING:
    from cmdare.cloud.catalog_model import Catalog

__all__ = ["DEFAULT_WORKER_GPU", "Workers", "default_gpu_note", "parse_gpu_counts", "parse_workers"]

#: The GPU type of a bare ``--workers N`` where a command needs a type and none is given (``plan simulate``,
#: ``predict cluster-speed``, ``cluster-config`` without ``--gpu``): T4, the cheapest current GPU that both GCP
#: and AWS rent as spot servers in every region of the catalog. K80, the papers' GPU, is retired (see
#: ``cmdare catalog``) and is used only when named.
DEFAULT_WORKER_GPU = "t4"


@dataclass(frozen=True)
class Workers:
    """``--workers`` as typed: ``total`` workers, and ``mix`` (workers per GPU type, lower case, in the order
    given) when GPU types were named; ``None`` for a bare count."""

    total: int
    mix: dict[str, int] | None = None

    def counts(self, gpu: str = DEFAULT_WORKER_GPU) -> dict[str, int]:
        """Workers per GPU type: the mix, or all ``total`` of ``gpu`` for a bare count."""
        return dict(self.mix) if self.mix is not None else {gpu.strip().lower(): self.total}

    @property
    def mix_text(self) -> str | None:
        """The mix written back (``k80:2,v100:1``), or None for a bare count."""
        return None if self.mix is None else ",".join(f"{gpu}:{n}" for gpu, n in self.mix.items())


def parse_workers(text: str | int, catalog: Catalog | None = None) -> Workers:
    """``--workers``: a count (``4``) or a mix of GPU types (``k80:2,v100:1``; a bare name counts one).

    Args:
        text: the option's value.
        catalog: the catalog whose GPU types are valid (default: the default catalog).

    Raises:
        UserInputError: a count below 1, a malformed mix, or a mix naming a type with fewer than 1 worker.
        UnknownNameError: a GPU type the catalog does not know (the message lists them).
    """
    raw = str(text).strip()
    if re.fullmatch(r"[+-]?\d+", raw):
        count = int(raw)
        if count < 1:
            raise UserInputError(f"--workers must be at least 1, got {count}")
        return Workers(count)
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", raw):
        raise UserInputError(f"--workers must be a whole number or a mix such as k80:2,v100:1, got {raw!r}")
    try:
        counts = parse_gpu_counts(raw, catalog, min_count=1)
    except DataFormatError as err:
        raise UserInputError(f"--workers: {err}") from None
    return Workers(sum(counts.values()), counts)


def default_gpu_note(count: int, gpu: str, cloud: str | None = None, typed: bool = True) -> str:
    """What a bare count of workers became, for the command's output, e.g. ``--workers 4: 4 x T4 (the default
    GPU of gcp; --workers TYPE:N for another, e.g. v100:4)``; ``typed=False``: the count was the default too."""
    whose = f"the default GPU of {cloud}" if cloud else "the default GPU"
    example = "v100" if gpu.strip().lower() != "v100" else "t4"
    said = f"--workers {count}" + ("" if typed else " (the default)")
    return f"{said}: {count} x {gpu.strip().upper()} ({whose}; --workers TYPE:N for another, e.g. {example}:{count})"


def parse_gpu_counts(
    spec: str | Sequence[str] | Mapping[str, int], catalog: Catalog | None = None, min_count: int = 0,
) -> dict[str, int]:
    """``"k80:2,p100:1"``, ``["k80", "k80", "p100"]`` or ``{"k80": 2}`` -> ``{"k80": 2, "p100": 1}``.

    A bare name counts one; entries of the same type add up; zero counts are dropped. Keys are lower
    case, in first-seen order.

    Args:
        spec: the mix.
        catalog: the catalog whose GPU types are valid (default: the default catalog).
        min_count: the fewest an entry may name (1: a zero count is refused, not dropped).

    Raises:
        DataFormatError: for a malformed entry, a negative count, one below ``min_count``, or a mix without GPUs.
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
        if int(num) < min_count:
            raise DataFormatError(f"need at least {min_count} worker of {name.strip()}, got {num}")
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
