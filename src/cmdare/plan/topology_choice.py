"""Why the plan's chosen cluster trains through a parameter server or with all-reduce.

The plan's search prices every candidate cluster in each topology it is given (the simulator drives the run
controller of a PS run, or of an all-reduce run). For the cluster it chooses, this says what each topology's
speed would be on those workers (:func:`cmdare.predict.allreduce_speed.compare_topologies`: the slowest member's
computation, the ring's time over the link) and at what link speed the faster one changes.
"""

from __future__ import annotations

from typing import Any

from cmdare.predict.allreduce_speed import (
    MIXED_GPUS_NOTE,
    TOPOLOGY_NAMES,
    compare_topologies,
    crossover_link_gbps,
    crossover_words,
)

__all__ = ["topology_choice"]


def topology_choice(features: Any, gpu_counts: dict[str, int], ps: int, link_gbps: float, chosen: str,
                    priced: tuple[str, ...] = ("ps", "allreduce"), batch_size: int | None = None,
                    precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """A sentence for the plan's reasons and the same as JSON: the topology the search ``chosen`` for
    ``gpu_counts`` workers (``ps`` shards in a PS run) over ``link_gbps`` links, the batches/s of each, and
    where the faster one flips; ``priced``: the topologies the search priced."""
    ps = max(1, ps)
    speeds = compare_topologies(features, gpu_counts, ps, link_gbps, batch_size=batch_size, precision=precision)
    below, flip = crossover_link_gbps(features, gpu_counts, ps, batch_size=batch_size, precision=precision)
    where = crossover_words(below, flip)
    mixed = f"; {MIXED_GPUS_NOTE}" if len(gpu_counts) > 1 else ""
    other = "allreduce" if chosen == "ps" else "ps"
    unpriced = "" if other in priced else f" ({TOPOLOGY_NAMES[other]} was not priced: --topologies)"
    text = (f"topology: {TOPOLOGY_NAMES[chosen]} chosen{unpriced}; {speeds.why()}{mixed}; {where}"
            + (" (train it with cmdare train --topology allreduce)" if chosen == "allreduce" else ""))
    return text, {"recommended": chosen, "faster": speeds.recommended, "priced": list(priced),
                  "link_gbps": link_gbps,
                  "ps_batches_per_s": round(speeds.ps_batches_per_s, 3),
                  "allreduce_batches_per_s": round(speeds.allreduce_batches_per_s, 3),
                  "slowest_member_compute_s": round(speeds.compute_s, 5), "ring_allreduce_s": round(speeds.ring_s, 5),
                  "faster_below_crossover": below, "crossover_link_gbps": None if flip is None else round(flip, 2)}
