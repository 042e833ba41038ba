"""What a server is: a frozen spec (GPU type, cloud, region, transient flag, price) and its cost.

A *server* hosts one worker (a GPU server) or parameter shards (a CPU-only PS server). Locally, a
server is a Ray node and ``cloud='local'``; its price still comes from the catalog entry it emulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cmdare.errors import UserInputError

__all__ = ["CLOUDS", "CMDARE_RESOURCE_PREFIX", "GPU_RESOURCE_PREFIX", "HEAD_RESOURCE", "PS_RESOURCE", "ROLES",
           "ServerSpec", "WORKER_RESOURCE", "cost_usd", "gpu_resource"]

CLOUDS: tuple[str, ...] = ("gcp", "aws", "local")
ROLES: tuple[str, ...] = ("worker", "ps", "head")
# Custom Ray resources of a cluster's nodes (what `cmdare cluster-config` gives each node type): a worker
# node has WORKER_RESOURCE and gpu_resource(its GPU type), one per GPU; a PS node has PS_RESOURCE; the
# head HEAD_RESOURCE. A cluster whose nodes offer none of these was not started by cmdare.
WORKER_RESOURCE = "cmdare_worker"
PS_RESOURCE = "cmdare_ps"
HEAD_RESOURCE = "cmdare_head"
GPU_RESOURCE_PREFIX = "cmdare_gpu_"
CMDARE_RESOURCE_PREFIX = "cmdare_"


def gpu_resource(gpu_type: str) -> str:
    """The Ray resource that marks worker nodes of ``gpu_type``, e.g. ``'cmdare_gpu_k80'``."""
    return GPU_RESOURCE_PREFIX + str(gpu_type).strip().lower()


@dataclass(frozen=True)
class ServerSpec:
    """What to start: one server's GPU type (``None``: CPU only), cloud, region, pricing and role.

    Attributes:
        gpu_type: GPU type name as in the catalog (e.g. ``'K80'``), or ``None`` for a CPU-only server.
        cloud: ``'gcp'``, ``'aws'`` or ``'local'`` (an emulated server, a Ray node on this machine).
        region: cloud region (``'local'`` for local servers).
        transient: ``True`` for preemptible/Spot servers, which can be revoked.
        price_per_hour_usd: what one worker slot (or the PS server) costs per hour.
        role: ``'worker'``, ``'ps'`` or ``'head'``.

    Raises:
        UserInputError: a field is invalid (checked when the spec is built).
    """

    gpu_type: str | None
    cloud: str
    region: str
    transient: bool
    price_per_hour_usd: float
    role: str = "worker"

    def __post_init__(self) -> None:
        if self.gpu_type is not None and (not isinstance(self.gpu_type, str) or not self.gpu_type.strip()):
            raise UserInputError(f"ServerSpec.gpu_type must be a GPU name or None, got {self.gpu_type!r}")
        if self.cloud not in CLOUDS:
            raise UserInputError(f"ServerSpec.cloud must be one of {', '.join(CLOUDS)}, got {self.cloud!r}")
        if not isinstance(self.region, str) or not self.region.strip():
            raise UserInputError(f"ServerSpec.region must be a non-empty string, got {self.region!r}")
        if not isinstance(self.transient, bool):
            raise UserInputError(f"ServerSpec.transient must be True or False, got {self.transient!r}")
        price = self.price_per_hour_usd
        if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
            raise UserInputError(f"ServerSpec.price_per_hour_usd must be a finite number >= 0, got {price!r}")
        if self.role not in ROLES:
            raise UserInputError(f"ServerSpec.role must be one of {', '.join(ROLES)}, got {self.role!r}")

    @property
    def label(self) -> str:
        """Short human label, e.g. ``'K80 spot gcp/us-east1'``."""
        model = "spot" if self.transient else "on-demand"
        return f"{self.gpu_type or 'CPU'} {model} {self.cloud}/{self.region}"

    def as_dict(self) -> dict[str, object]:
        """The spec as JSON-able values (:meth:`from_dict` reads it back)."""
        return {"gpu_type": self.gpu_type, "cloud": self.cloud, "region": self.region, "transient": self.transient,
                "price_per_hour_usd": self.price_per_hour_usd, "role": self.role}

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> ServerSpec:
        """A spec from :meth:`as_dict`'s values (raises ``UserInputError`` on a bad field)."""
        return cls(**values)  # type: ignore[arg-type]


def cost_usd(spec: ServerSpec, uptime_s: float, minimum_s: float = 0.0, whole_seconds: bool = True) -> float:
    """What ``spec`` costs for ``uptime_s`` seconds with per-second billing.

    Uptime is rounded up to whole seconds (``whole_seconds=False``: billed continuously, as emulated time is,
    where one second stands for many of the cloud's). GCE and EC2 (Linux) bill at least one minute per start;
    pass ``minimum_s=60`` to include that minimum.

    Raises:
        UserInputError: ``uptime_s`` or ``minimum_s`` is negative or not finite.
    """
    for name, value in (("uptime_s", uptime_s), ("minimum_s", minimum_s)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise UserInputError(f"{name} must be a finite number >= 0, got {value!r}")
    billed_s = max(math.ceil(uptime_s) if whole_seconds else uptime_s, minimum_s) if uptime_s > 0 else 0.0
    return spec.price_per_hour_usd * billed_s / 3600.0
