"""What a replacement may be rented as: the offer set the ``cheapest`` policy chooses from.

One rule for every driver, so that ``cmdare train`` and its simulation fall back to the same server: every
transient worker offering of the lost server's cloud in the catalog (any region: a spot market that is out of
capacity in one region often has it in another; retired GPU types included, a run on them is the user's
choice), each at the speed the run's model trains at on its GPU type. Without a speed model (``same``-type
fallbacks), only offerings of the lost server's GPU type, all at one speed, so the lowest price wins. A GPU type
the speed model cannot price is left out. The drivers pass in their catalog and their speed model (the trainer's
step-time model for the run's network, the planner's for the job's workload).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cmdare.cloud.servers import ServerSpec
from cmdare.control.replacement import Offer

__all__ = ["ReplacementOffers"]


class ReplacementOffers:
    """The offerings a replacement of a lost server may run on (:class:`Offer` values), cached per cloud.

    Args:
        catalog: the server catalog (:class:`~cmdare.cloud.catalog_model.Catalog`).
        speed: steps per second a worker of a GPU type trains at (None: that type cannot be priced); None: no
            speed model, only the lost server's type is offered.
    """

    def __init__(self, catalog: Any, speed: Callable[[str], float | None] | None = None):
        self.catalog, self.speed = catalog, speed
        self._known: dict[tuple[str | None, str | None], list[Offer]] = {}

    def __call__(self, lost: ServerSpec) -> list[Offer]:
        cloud = lost.cloud if lost.cloud != "local" else None  # an emulated run: any cloud's offerings
        gpu = None if self.speed is not None else lost.gpu_type
        key = (cloud, gpu)
        if key not in self._known:
            self._known[key] = self._offers(cloud, gpu)
        return self._known[key]

    def _offers(self, cloud: str | None, gpu: str | None) -> list[Offer]:
        speeds: dict[str, float | None] = {}
        out = []
        for o in self.catalog.find(gpu=gpu, cloud=cloud, role="worker", include_retired=True):
            price = o.slot_price_per_hour_usd(True)
            if price is None or o.gpu is None:
                continue
            if self.speed is None:
                steps_per_s: float | None = 1.0
            else:
                if o.gpu not in speeds:
                    speeds[o.gpu] = self.speed(o.gpu)
                steps_per_s = speeds[o.gpu]
            if steps_per_s:
                out.append(Offer(ServerSpec(o.gpu, o.cloud, o.region, True, price, o.role), steps_per_s))
        return out
