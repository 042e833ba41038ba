"""Which cluster to rent: enumerate configurations, simulate them, keep the time/cost Pareto front.

How a plan stays fast (``bench/planner.py`` measures it):

1. **Exact where nothing is random.** On-demand configurations cannot be revoked; one analytic run is
   their exact result, so they cost no Monte Carlo at all.
2. **Cache.** Cluster speed depends on the membership (GPU counts, #PS), not on the region, the
   pricing or the run; the speed model is asked once per membership for the whole plan.
3. **Prune dominated configurations.** Before simulating a transient configuration we bound it from
   below: its time is at least the revocation-free time of its fastest sub-membership, and its cost
   at least the steps times the cheapest USD-per-step of any sub-membership (revocations only remove
   workers; replacements bill while they start and add nothing). If an already simulated option is
   at least as fast and cheap as both bounds, the configuration cannot reach the expected-value
   front and is skipped. Configurations are visited in increasing bound order so the front fills early.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from cmdare.errors import UserInputError
from cmdare.plan.pareto import pareto_front
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import PS_SERVER, ClusterSpec, JobSpec, PlanModels, SimSummary, WorkerGroup

#: Most workers a plan explores per cluster (its configurations grow with the square of it, mixes included).
MAX_ENUMERATED_WORKERS = 64

__all__ = ["PlanOption", "Recommendation", "enumerate_clusters", "format_duration", "job_for", "recommend"]


@dataclass(frozen=True)
class PlanOption:
    """One evaluated configuration."""

    cluster: ClusterSpec
    summary: SimSummary

    @property
    def point(self) -> tuple[float, float]:
        """(mean time s, mean cost USD)."""
        return (self.summary.time_mean_s, self.summary.cost_mean_usd)

    @property
    def accuracy(self) -> float:
        """Mean predicted final accuracy (NaN without an accuracy model)."""
        return self.summary.extra.get("accuracy_mean", math.nan)


@dataclass(frozen=True)
class Recommendation:
    """The plan: every simulated option, the Pareto front, the choice and why."""

    options: tuple[PlanOption, ...]
    front: tuple[PlanOption, ...]
    choice: PlanOption | None
    constraint_met: bool
    message: str
    reasons: tuple[str, ...] = ()
    stats: dict[str, float] = field(default_factory=dict)


def format_duration(seconds: float) -> str:
    """``5400`` -> ``1h 30m``; ``600`` -> ``10 min``; ``42`` -> ``42 s``."""
    if not math.isfinite(seconds):
        return "never"
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    h, m = divmod(round(s / 60), 60)
    return f"{h}h {m:02d}m"


def enumerate_clusters(
    gpus: Sequence[str],
    regions: Sequence[str],
    max_workers: int,
    max_ps: int = 3,
    mixes: bool = True,
    replacement: str = "same",
    ps_markets: Sequence[bool] = (False,),
    topologies: Sequence[str] = ("ps",),
) -> list[ClusterSpec]:
    """Every configuration to consider.

    Homogeneous clusters of 1..``max_workers`` workers of each GPU type, mixes of two types
    (any split, at most ``max_workers`` in all), transient or on-demand workers, in each region, trained
    through 1..``max_ps`` PS (``"ps"`` in ``topologies``) and with all-reduce (``"allreduce"``, 2 workers or more);
    plus single-server training (one worker, no PS). ``ps_markets``: PS servers on on-demand (False) and/or spot
    (True) servers.
    """
    if not 1 <= max_workers <= MAX_ENUMERATED_WORKERS:
        raise UserInputError(f"max workers must be at least 1 and at most {MAX_ENUMERATED_WORKERS}, got {max_workers}")
    if not 1 <= max_ps <= 8:
        raise UserInputError(f"max PS must be between 1 and 8, got {max_ps}")
    out: list[ClusterSpec] = []
    shapes: list[tuple[tuple[str, int], ...]] = []
    for gpu in gpus:
        shapes += [((gpu, n),) for n in range(1, max_workers + 1)]
    if mixes:
        for a, b in itertools.combinations(gpus, 2):
            for na in range(1, max_workers):
                shapes += [((a, na), (b, nb)) for nb in range(1, max_workers - na + 1)]
    for region in regions:
        for transient in (True, False):
            for shape in shapes:
                groups = tuple(WorkerGroup(g, n, transient, region) for g, n in shape)
                n_workers = sum(n for _, n in shape)
                ps_choices = ([0] if n_workers == 1 else []) + \
                    (list(range(1, max_ps + 1)) if "ps" in topologies else [])
                for ps in ps_choices:
                    for spot_ps in ps_markets if ps else (False,):
                        out.append(ClusterSpec(groups, ps=ps, region=region, ps_transient=spot_ps,
                                               replacement=replacement))
                if "allreduce" in topologies and n_workers > 1:
                    out.append(ClusterSpec(groups, ps=0, region=region, replacement=replacement, topology="allreduce"))
    return out


def job_for(job: JobSpec, cluster: ClusterSpec) -> JobSpec:
    """The job as ``cluster`` trains it. An asynchronous PS step trains one batch; an all-reduce group step trains
    one per member: so an all-reduce group of ``n`` trains an asynchronous job's batches in ``1/n`` of its steps,
    checkpointing as often in batches. (A synchronous job's steps are rounds of every worker's batch: the same.)"""
    if cluster.topology != "allreduce" or job.sync:
        return job
    n = cluster.n_workers
    return dataclasses.replace(job, total_steps=math.ceil(job.total_steps / n),
                               checkpoint_every_steps=max(1, round(job.checkpoint_every_steps / n)))


def evaluate(
    job: JobSpec,
    clusters: Sequence[ClusterSpec],
    models: PlanModels,
    runs: int = 100,
    seed: int = 0,
    prune: bool = True,
    min_accuracy: float | None = None,
) -> tuple[list[PlanOption], dict[str, float]]:
    """Simulate ``clusters`` (pruning dominated ones when ``prune``); return options and counts.

    With ``min_accuracy`` only options predicted to reach it may prune others (a dominated but more
    accurate configuration may be the only one that qualifies)."""
    t0 = time.perf_counter()
    sims = [Simulator(job_for(job, c), c, models) for c in clusters]
    options: list[PlanOption] = []
    pending: list[tuple[float, float, Simulator]] = []
    beyond = 0
    for sim in sims:
        if not sim.cluster.any_transient:
            options.append(PlanOption(sim.cluster, sim.summarize(1, seed)))
        elif sim.beyond_horizon:  # too long to simulate: not an option
            beyond += 1
        elif prune and sim.cluster.replacement == "same":
            t_low, c_low = sim.lower_bounds()
            pending.append((t_low, c_low, sim))
        else:
            pending.append((0.0, 0.0, sim))
    pending.sort(key=lambda p: p[0] * p[1])
    pruned = 0
    for t_low, c_low, sim in pending:
        if prune and any(
            o.point[0] <= t_low and o.point[1] <= c_low and _reaches(o, min_accuracy) for o in options
        ):
            pruned += 1
            continue
        options.append(PlanOption(sim.cluster, sim.summarize(runs, seed)))
    stats = {
        "configurations": len(clusters),
        "simulated_monte_carlo": len(pending) - pruned,
        "exact_on_demand": len(clusters) - len(pending) - beyond,
        "pruned_dominated": pruned,
        "beyond_horizon": beyond,
        "runs_per_configuration": runs,
        "seconds": time.perf_counter() - t0,
    }
    return options, stats


def _desc(o: PlanOption) -> str:
    s = o.summary
    text = (
        f"{o.cluster.label()}: {format_duration(s.time_mean_s)} (P95 {format_duration(s.time_p95_s)}), "
        f"${s.cost_mean_usd:.2f} (P95 ${s.cost_p95_usd:.2f})"
    )
    if "accuracy_mean" in s.extra:
        text += f", accuracy {s.extra['accuracy_mean']:.1%} (P5 {s.extra['accuracy_p5']:.1%})"
    return text


def _reaches(option: PlanOption, min_accuracy: float | None) -> bool:
    return min_accuracy is None or option.accuracy >= min_accuracy


def _speed(models: PlanModels, counts: dict[str, int], ps: int) -> float:
    return models.speed.cluster_steps_per_s(counts, ps)


def _saturation_workers(models: PlanModels, gpu: str, ps: int, up_to: int = 16) -> int | None:
    """Worker count ``n`` after which one more ``gpu`` worker adds under half its solo speed."""
    solo = models.speed.worker_steps_per_s(gpu)
    prev = _speed(models, {gpu: 1}, ps)
    for n in range(1, up_to):
        cur = _speed(models, {gpu: n + 1}, ps)
        if cur - prev < 0.5 * solo:
            return n
        prev = cur
    return None


def explain(choice: PlanOption, options: Sequence[PlanOption], models: PlanModels) -> list[str]:
    """Reasons for a choice, from its neighbours in configuration space."""
    c = choice.cluster
    reasons: list[str] = []
    counts = c.gpu_counts
    topology = _topology_reason(choice, options)
    if topology:
        reasons.append(topology)
    through_ps = c.topology == "ps"
    if through_ps and c.ps >= 2:
        fewer = _speed(models, counts, c.ps - 1)
        more = _speed(models, counts, c.ps)
        gpu = max(counts, key=counts.get)
        sat = _saturation_workers(models, gpu, c.ps - 1)
        ordinal = {2: "2nd", 3: "3rd"}.get(c.ps, f"{c.ps}th")
        shards = "one PS" if c.ps == 2 else f"{c.ps - 1} PS"
        where = f"; {gpu.upper()} workers saturate {shards} at {sat}-{sat + 1} workers" if sat else ""
        reasons.append(
            f"a {ordinal} PS: {fewer:.1f} -> {more:.1f} steps/s ({more / fewer - 1:+.0%}) "
            f"for {c.n_workers} workers{where}"
        )
    elif through_ps and c.ps == 1 and c.n_workers > 1:
        gain = _speed(models, counts, 2) / _speed(models, counts, 1) - 1
        reasons.append(f"one PS suffices: a 2nd would add only {gain:.0%} speed for {c.n_workers} workers")
    elif through_ps and c.ps == 0:
        reasons.append("single server: no PS to pay for, and one worker gains nothing from one")
    if any(g.transient for g in c.workers):
        twin = _twin(choice, options, transient=False)
        if twin is not None:
            saving = 1 - choice.summary.cost_mean_usd / twin.summary.cost_mean_usd
            slower = choice.summary.time_mean_s / twin.summary.time_mean_s - 1
            reasons.append(
                f"transient: {saving:.0%} cheaper than on-demand for {slower:+.0%} time "
                f"({choice.summary.revocations_mean:.1f} revocations expected)"
            )
    else:
        twin = _twin(choice, options, transient=True)
        if twin is not None and twin.summary.time_mean_s > choice.summary.time_mean_s:
            reasons.append(
                f"on-demand: transient would take {format_duration(twin.summary.time_mean_s)} "
                f"(P95 {format_duration(twin.summary.time_p95_s)}) with "
                f"{twin.summary.revocations_mean:.1f} revocations"
            )
    reasons += _ps_market_reasons(choice, options, models)
    if len(counts) == 1:
        (gpu,) = counts
        per_step = {}
        for g in {o.cluster.workers[0].gpu for o in options}:
            try:
                price = models.prices.price_per_hour_usd(g, c.region, c.workers[0].transient)
            except UserInputError:  # not sold so here (no spot K80 on AWS): not a rival
                continue
            per_step[g] = price / models.speed.worker_steps_per_s(g)
        if min(per_step, key=per_step.get) == gpu and len(per_step) > 1:
            reasons.append(f"{gpu.upper()}: lowest cost per step of the GPU types considered")
    return reasons


def _ps_market_reasons(choice: PlanOption, options: Sequence[PlanOption], models: PlanModels) -> list[str]:
    """Whether spot PS servers pay, against the same cluster with the other PS market."""
    c = choice.cluster
    if c.ps == 0:  # no PS servers: single-server or all-reduce training
        return []
    twin = next((o for o in options if o.cluster == dataclasses.replace(c, ps_transient=not c.ps_transient)), None)
    if twin is None and c.ps_transient:  # the on-demand twin was pruned: price the PS servers alone
        price = models.prices.price_per_hour_usd
        extra = c.ps * (price(PS_SERVER, c.region, False) - price(PS_SERVER, c.region, True))
        evac = choice.summary.extra.get("evacuations_mean", 0.0)
        return [f"spot PS pays: on-demand PS would cost ${extra * choice.summary.time_mean_s / 3600:.2f} more "
                f"over the run, with no time to win back ({evac:.1f} shard evacuations expected)"]
    if twin is None:
        return []
    spot, od = (choice, twin) if c.ps_transient else (twin, choice)
    saving = 1 - spot.summary.cost_mean_usd / od.summary.cost_mean_usd
    slower = spot.summary.time_mean_s / od.summary.time_mean_s - 1
    evac = spot.summary.extra.get("evacuations_mean", 0.0)
    if c.ps_transient:
        return [f"spot PS pays: {saving:.0%} cheaper than on-demand PS for {slower:+.1%} time "
                f"({evac:.1f} shard evacuations expected, {spot.summary.steps_lost_mean:.0f} steps lost)"]
    return [f"on-demand PS: spot PS would save {saving:.0%} for {slower:+.1%} time "
            f"(P95 {format_duration(spot.summary.time_p95_s)}), not worth it under the constraint"]


def _topology_reason(choice: PlanOption, options: Sequence[PlanOption]) -> str | None:
    """The chosen topology against the best option of the other on the same workers (None: the other was not
    priced, or pruned as dominated)."""
    c = choice.cluster
    rivals = [o for o in options if o.cluster.topology != c.topology and o.cluster.n_workers > 1
              and o.cluster.workers == c.workers]
    if c.n_workers < 2 or not rivals:
        return None
    rival = min(rivals, key=lambda o: o.point[0] * o.point[1])
    s, r = choice.summary, rival.summary
    return (f"{'all-reduce' if c.topology == 'allreduce' else 'a PS'} over "
            f"{'all-reduce' if rival.cluster.topology == 'allreduce' else f'{rival.cluster.ps} PS'} on these "
            f"workers: {format_duration(s.time_mean_s)} and ${s.cost_mean_usd:.2f} against "
            f"{format_duration(r.time_mean_s)} and ${r.cost_mean_usd:.2f}")


def _twin(choice: PlanOption, options: Sequence[PlanOption], transient: bool) -> PlanOption | None:
    c = choice.cluster
    want = tuple((g.gpu, g.count, transient, g.region) for g in c.workers)
    for o in options:
        oc = o.cluster
        if oc.ps == c.ps and oc.topology == c.topology and oc.region == c.region and \
                oc.ps_transient == c.ps_transient and tuple(
            (g.gpu, g.count, g.transient, g.region) for g in oc.workers
        ) == want:
            return o
    return None


def recommend(
    job: JobSpec,
    clusters: Sequence[ClusterSpec],
    models: PlanModels,
    deadline_s: float | None = None,
    budget_usd: float | None = None,
    runs: int = 100,
    seed: int = 0,
    prune: bool = True,
    min_accuracy: float | None = None,
) -> Recommendation:
    """Simulate the configurations and pick one.

    With ``min_accuracy``: only options whose mean predicted final accuracy reaches it are considered
    (the front is theirs); when none does, the answer names the most accurate option.
    With a deadline: the cheapest option whose expected time meets it (and the budget, if given).
    With only a budget: the fastest option whose expected cost fits. With neither: the option with the
    smallest time x cost. When nothing meets the constraints the answer names the closest option.

    Raises:
        UserInputError: for a non-positive deadline, a negative budget, an accuracy outside (0, 1],
            an accuracy threshold without an accuracy model, or no configurations.
    """
    if min_accuracy is not None:
        if not 0 < min_accuracy <= 1:
            raise UserInputError(f"the minimum accuracy is a fraction in (0, 1], e.g. 0.91; got {min_accuracy}")
        if models.accuracy is None:
            raise UserInputError("no accuracy model for this workload: drop the minimum accuracy")
    if deadline_s is not None and deadline_s <= 0:
        raise UserInputError(f"the deadline must be in the future, got {deadline_s:.0f} s from now")
    if budget_usd is not None and budget_usd < 0:
        raise UserInputError(f"the budget must not be negative, got ${budget_usd}")
    if not clusters:
        raise UserInputError("no configurations to consider")
    options, stats = evaluate(job, clusters, models, runs, seed, prune, min_accuracy)
    qualified = [o for o in options if _reaches(o, min_accuracy)]
    if not qualified:
        # the most accurate; among equally accurate ones the best time x cost
        best = max(options, key=lambda o: (round(o.accuracy, 6), -o.point[0] * o.point[1]))
        msg = (
            f"no configuration is predicted to reach {min_accuracy:.1%} accuracy; the most accurate is "
            f"{_desc(best)}"
        )
        front = [options[i] for i in pareto_front([o.point for o in options])]
        return Recommendation(tuple(options), tuple(front), best, False, msg, (), stats)
    front = [qualified[i] for i in pareto_front([o.point for o in qualified])]
    fastest = front[0]
    cheapest = front[-1]
    ok_time = [o for o in front if deadline_s is None or o.summary.time_mean_s <= deadline_s]
    ok = [o for o in ok_time if budget_usd is None or o.summary.cost_mean_usd <= budget_usd]

    note = "" if min_accuracy is None else (
        f" (of the {len(qualified)} configurations predicted to reach {min_accuracy:.1%} accuracy)"
    )
    if deadline_s is not None:
        if not ok_time:
            msg = f"no configuration meets {format_duration(deadline_s)}; fastest is {_desc(fastest)}"
            return Recommendation(tuple(options), tuple(front), fastest, False, msg + note, (), stats)
        if not ok:
            best = min(ok_time, key=lambda o: o.summary.cost_mean_usd)
            msg = (
                f"no configuration meets {format_duration(deadline_s)} within ${budget_usd:.2f}; "
                f"cheapest that meets the deadline is {_desc(best)}"
            )
            return Recommendation(tuple(options), tuple(front), best, False, msg + note, (), stats)
        choice = min(ok, key=lambda o: (o.summary.cost_mean_usd, o.summary.time_mean_s))
        msg = f"cheapest meeting {format_duration(deadline_s)}: {_desc(choice)}"
    elif budget_usd is not None:
        if not ok:
            msg = f"no configuration fits ${budget_usd:.2f}; cheapest is {_desc(cheapest)}"
            return Recommendation(tuple(options), tuple(front), cheapest, False, msg + note, (), stats)
        choice = min(ok, key=lambda o: (o.summary.time_mean_s, o.summary.cost_mean_usd))
        msg = f"fastest within ${budget_usd:.2f}: {_desc(choice)}"
    else:
        choice = min(front, key=lambda o: o.summary.time_mean_s * o.summary.cost_mean_usd)
        msg = f"best time x cost: {_desc(choice)}"
    return Recommendation(
        tuple(options), tuple(front), choice, True, msg + note, tuple(explain(choice, options, models)), stats
    )



