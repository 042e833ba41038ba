"""The speed of data-parallel all-reduce training beside a parameter server's, and where a PS stops paying.

An all-reduce step of ``n`` members is gated by the slowest member's computation (forward and backward at its
batch), and its gradients are averaged with a ring all-reduce: each member sends and receives
``2 (n - 1) / n`` times the model's bytes, in ``2 (n - 1)`` latency-bound rounds. Buckets start during backward
(as DDP does), so the ring overlaps backward: it cannot start before backward does (after the forward pass,
about a third of the computation), and the last bucket always follows it::

    step = max(compute + ring * last_bucket_share, compute / 3 + ring)

Each step trains ``n`` batches; an asynchronous PS step trains one. So they are compared in batches per second.

* A member's computation is the step-time model's time for its GPU (which CM-DARE measured in PS runs) times
  the share of it the cross-generation model gives to computation rather than to the PS's pull and push
  (:class:`~cmdare.predict.generations.GenerationStepModel` with and without its PS terms).
* The link: ``link_gbps`` per server, default 10 Gbit/s. The PS model's service times are fitted on CM-DARE's
  network, taken as that default; at another link speed the PS's service demand scales by ``10 / link_gbps``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cmdare.predict import PS_MODEL_LINK_GBPS
from cmdare.predict.workloads import WorkloadFeatures

__all__ = ["DEFAULT_LINK_GBPS", "MIXED_GPUS_NOTE", "TOPOLOGY_NAMES", "TopologySpeeds", "allreduce_step_s",
           "allreduce_steps_per_s", "compare_topologies", "crossover_link_gbps", "crossover_words",
           "member_compute_s", "ring_allreduce_s"]

DEFAULT_LINK_GBPS = PS_MODEL_LINK_GBPS  # per server: the network CM-DARE's PS measurements are taken to have had
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket, as cmdare's members use (cmdare.collective.buckets)
FORWARD_SHARE = 1.0 / 3.0  # forward of forward + backward: the ring cannot start before backward does
TOPOLOGY_NAMES = {"ps": "a PS", "allreduce": "all-reduce"}  # in sentences
MIXED_GPUS_NOTE = "the slowest GPU type gates every all-reduce step"  # said wherever a mix is priced


def ring_allreduce_s(num_params: float, members: int, link_gbps: float, latency_ms: float,
                     bytes_per_param: int = 4) -> float:
    """Seconds of a ring all-reduce of ``num_params`` parameters among ``members`` over ``link_gbps`` links."""
    if members <= 1:
        return 0.0
    volume = 2.0 * (members - 1) / members * num_params * bytes_per_param
    return volume / (link_gbps * 1e9 / 8.0) + 2 * (members - 1) * latency_ms / 1e3


def allreduce_step_s(compute_s: Sequence[float], num_params: float, link_gbps: float = DEFAULT_LINK_GBPS,
                     latency_ms: float = 0.3) -> float:
    """Seconds per all-reduce step of members computing for ``compute_s`` each (the module's formula)."""
    slowest = max(compute_s)
    ring = ring_allreduce_s(num_params, len(compute_s), link_gbps, latency_ms)
    last = min(1.0, BUCKET_BYTES / max(1.0, num_params * 4.0))
    return max(slowest + ring * last, slowest * FORWARD_SHARE + ring)


@dataclass(frozen=True)
class TopologySpeeds:
    """Both topologies on one cluster, in batches per second (``allreduce_steps_per_s``: group steps of
    ``members`` batches each)."""

    members: int
    ps_batches_per_s: float
    allreduce_batches_per_s: float
    allreduce_steps_per_s: float
    compute_s: float  # the slowest member's computation per step
    ring_s: float  # one ring all-reduce of the model
    link_gbps: float
    ps: int

    @property
    def recommended(self) -> str:
        """``allreduce`` or ``ps``: the faster (a PS on a tie: it needs no group re-formation on a loss)."""
        return "allreduce" if self.allreduce_batches_per_s > self.ps_batches_per_s else "ps"

    def why(self) -> str:
        """One sentence: which is faster, by how much, and what gates each."""
        a, p = self.allreduce_batches_per_s, self.ps_batches_per_s
        fast, slow = TOPOLOGY_NAMES[self.recommended], TOPOLOGY_NAMES[_other(self.recommended)]
        ratio = max(a, p) / min(a, p) if min(a, p) > 0 else float("inf")
        return (f"{fast} trains {ratio:.2f}x the batches/s of {slow} ({a:.1f} vs {p:.1f} batches/s with {self.ps} PS); "
                f"all-reduce: the slowest member computes {self.compute_s * 1e3:.0f} ms a step, a ring all-reduce "
                f"of the model takes {self.ring_s * 1e3:.0f} ms at {self.link_gbps:g} Gbit/s")


def _compute_share(workload: WorkloadFeatures, gpu: str, batch_size: int | None, precision: str) -> float:
    """The share of ``gpu``'s PS-run step time that is computation, by the cross-generation model."""
    from cmdare.cloud.gpu_specs import gpu_spec
    from cmdare.predict import step_flops
    from cmdare.predict.generations import generation_step_model
    from cmdare.predict.op_profile import op_profile_for

    profile = op_profile_for(step_flops(workload, batch_size), workload.num_params, workload.num_tensors)
    model, spec = generation_step_model(), gpu_spec(gpu)
    with_ps = model.predict(profile, spec, workload.num_params, workload.num_tensors, precision)
    alone = model.predict(profile, spec, workload.num_params, workload.num_tensors, precision,
                          parameter_server=False)
    return min(1.0, alone / with_ps) if with_ps > 0 else 1.0


def member_compute_s(workload: WorkloadFeatures, counts: Mapping[str, int], latency_ms: float = 0.3,
                     batch_size: int | None = None, precision: str = "fp32") -> list[float]:
    """Each member's computation per step (seconds), ``counts[gpu]`` members of each GPU type."""
    from cmdare.predict import predict_step_time_s

    compute: list[float] = []
    for gpu, n in counts.items():
        t = predict_step_time_s(workload, gpu, latency_ms, batch_size=batch_size, precision=precision)
        compute += [t * _compute_share(workload, gpu, batch_size, precision)] * int(n)
    return compute


def allreduce_steps_per_s(workload: WorkloadFeatures, counts: Mapping[str, int],
                          link_gbps: float = DEFAULT_LINK_GBPS, latency_ms: float = 0.3,
                          batch_size: int | None = None, precision: str = "fp32") -> float:
    """Group steps/s of all-reduce training with ``counts`` members (each step trains one batch per member)."""
    compute = member_compute_s(workload, counts, latency_ms, batch_size, precision)
    return 1.0 / allreduce_step_s(compute, workload.num_params, link_gbps, latency_ms)


def compare_topologies(workload: WorkloadFeatures, counts: Mapping[str, int], ps: int = 1,
                       link_gbps: float = DEFAULT_LINK_GBPS, latency_ms: float = 0.3, batch_size: int | None = None,
                       precision: str = "fp32", placement: str = "round-robin") -> TopologySpeeds:
    """Batches/s of ``counts`` workers (``{"v100": 4}``) training ``workload`` through ``ps`` parameter servers
    (asynchronous) and with all-reduce, over ``link_gbps`` links.

    Raises:
        UserInputError: a link speed that is not positive.
    """
    from cmdare.predict import predict_cluster_steps_per_s

    w = workload
    ps_speed = predict_cluster_steps_per_s(w, dict(counts), ps, latency_ms, placement, batch_size=batch_size,
                                           precision=precision, link_gbps=link_gbps)  # the link checked here
    compute = member_compute_s(w, counts, latency_ms, batch_size, precision)
    members = len(compute)
    step = allreduce_step_s(compute, w.num_params, link_gbps, latency_ms)
    return TopologySpeeds(members, ps_speed, members / step, 1.0 / step, max(compute),
                          ring_allreduce_s(w.num_params, members, link_gbps, latency_ms), link_gbps, ps)


def crossover_link_gbps(workload: WorkloadFeatures, counts: Mapping[str, int], ps: int = 1,
                        latency_ms: float = 0.3, batch_size: int | None = None, precision: str = "fp32",
                        placement: str = "round-robin") -> tuple[str, float | None]:
    """Where the recommendation flips on link speeds from 0.1 to 400 Gbit/s: ``(topology below, flip)``, the
    topology that wins on the slowest links and the first link speed (Gbit/s, to 10%) where the other wins from;
    ``flip`` None: the same topology wins on every link speed scanned."""
    def winner(gbps: float) -> str:
        return compare_topologies(workload, counts, ps, gbps, latency_ms, batch_size, precision,
                                  placement).recommended

    grid = [0.1 * 1.1 ** k for k in range(88)]  # 0.1 .. ~400 Gbit/s
    first = winner(grid[0])
    for gbps in grid[1:]:
        if winner(gbps) != first:
            return first, gbps
    return first, None


def crossover_words(below: str, flip: float | None) -> str:
    """:func:`crossover_link_gbps`'s answer in words."""
    if flip is None:
        return f"{TOPOLOGY_NAMES[below]} is faster at every link speed from 0.1 to 400 Gbit/s"
    return f"{TOPOLOGY_NAMES[below]} is faster below about {flip:.1f} Gbit/s, {TOPOLOGY_NAMES[_other(below)]} above"


def _other(topology: str) -> str:
    return "ps" if topology == "allreduce" else "allreduce"
