"""Which topology suits the plan's chosen cluster: a parameter server or all-reduce, and why.

The plan's search prices every candidate as a PS run (its simulator drives the run controller of a PS run).
For the cluster it chooses it also compares the two topologies by their predicted speed
(:func:`cmdare.predict.allreduce_speed.compare_topologies`) and names the link speed at which the choice flips.
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


def topology_choice(features: Any, gpu_counts: dict[str, int], ps: int, link_gbps: float,
                    batch_size: int | None = None, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """A sentence for the plan's reasons and the same as JSON: the topology recommended for ``gpu_counts``
    workers with ``ps`` shards over ``link_gbps`` links, the batches/s of each and where the choice flips."""
    ps = max(1, ps)
    speeds = compare_topologies(features, gpu_counts, ps, link_gbps, batch_size=batch_size, precision=precision)
    below, flip = crossover_link_gbps(features, gpu_counts, ps, batch_size=batch_size, precision=precision)
    where = crossover_words(below, flip)
    mixed = f"; {MIXED_GPUS_NOTE}" if len(gpu_counts) > 1 else ""
    text = (f"topology: {TOPOLOGY_NAMES[speeds.recommended]} recommended: {speeds.why()}{mixed}; {where}"
            + ("" if speeds.recommended == "ps" else
               " (train it with cmdare train --topology allreduce; the times and costs above are a PS run's: the "
               "plan's search prices every candidate as a PS run)"))
    return text, {"recommended": speeds.recommended, "link_gbps": link_gbps,
                  "ps_batches_per_s": round(speeds.ps_batches_per_s, 3),
                  "allreduce_batches_per_s": round(speeds.allreduce_batches_per_s, 3),
                  "slowest_member_compute_s": round(speeds.compute_s, 5), "ring_allreduce_s": round(speeds.ring_s, 5),
                  "faster_below_crossover": below, "crossover_link_gbps": None if flip is None else round(flip, 2)}
