"""``cmdare train ... --simulate``: the run a command line would start, simulated by the planner instead of
trained.

The command line is read once, into the run's :class:`~cmdare.train.spec.TrainSpec`, by ``cmdare train``
itself; this module (above both ``train`` and ``plan``, which may not import each other) turns that spec into
the planner's job, cluster and models and runs the Monte Carlo. A local run is simulated as it emulates its
cloud (:mod:`cmdare.plan.emulation`): the same step times, the cloud's clocks compressed by ``speedup``,
servers billed in emulated cloud time; a run that joins a cluster (``--address``) in real cloud time with the
planner's own models. Every option the simulator cannot honour is named in the output, never dropped.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import typer

from cmdare.train.spec import TrainSpec

__all__ = ["against_plan", "register", "simulate_train", "unsimulated_options"]

# TrainSpec field -> (its option, why the simulator cannot honour it) when it differs from the default
_NOT_SIMULATED: dict[str, tuple[str, str]] = {
    "placement": ("--placement", "the speed model knows no parameter placement"),
    "elastic_ps": ("--elastic-ps", "the shard count stays as started"),
    "auto_mitigate": ("--auto-mitigate", "no bottleneck is mitigated"),
    "straggler": ("--straggler", "no shard is slowed"),
    "ps_bandwidth": ("--ps-bandwidth", "the PS link is not emulated"),
    "on_diverge": ("--on-diverge", "no divergence or rollback is predicted"),
    "optimizer": ("--lr/--momentum/--weight-decay", "the accuracy model knows one setting"),
    "optimizer_name": ("--optimizer", "the accuracy model knows SGD only"),
}
# ... in a local run only (its emulated step times are the step-time model's float32 figures; a joined run's
# simulation predicts the cluster's GPUs at the run's precision)
_NOT_SIMULATED_LOCAL: dict[str, tuple[str, str]] = {
    "precision": ("--precision", "a local run's emulated step times are float32 predictions"),
}
# ... and in real cloud time only (a local run's emulated time does not count them either)
_NOT_SIMULATED_REAL: dict[str, tuple[str, str]] = {
    "sync": ("--sync", "the cluster-speed model is of asynchronous training"),
}


def unsimulated_options(spec: TrainSpec, joined: bool) -> list[str]:
    """The options of ``spec`` (those not at their default) that the simulator cannot honour, each with why;
    evaluations always (``joined``: they take the chief's time; locally they take no emulated time)."""
    default = TrainSpec()
    table = {**_NOT_SIMULATED, **(_NOT_SIMULATED_REAL if joined else _NOT_SIMULATED_LOCAL)}
    out = [f"{option} ({why})" for name, (option, why) in table.items()
           if getattr(spec, name) != getattr(default, name)]
    if joined and spec.eval_every:
        out.append("--eval-every (evaluations take no time in the simulation)")
    return out


def _input_shape(spec: TrainSpec) -> tuple[int, ...] | None:
    """One sample's shape of your own dataset (None: a built-in one, the model's profile shape)."""
    from cmdare.tasks import is_builtin_dataset

    if is_builtin_dataset(spec.dataset):
        return None
    x, _ = next(spec.task().stream(0, 1, 1, spec.seed))
    return tuple(x.shape[1:]) if hasattr(x, "shape") else None


def simulation_inputs(spec: TrainSpec, joined: bool) -> tuple[Any, Any, Any, Any]:
    """The planner's job, cluster and models for the run ``spec`` describes, and a factory of its revocation
    sources (fresh streams at each call)."""
    from cmdare.plan.adapters import load_plan_models
    from cmdare.plan.emulation import TrainerStartups, emulated_models
    from cmdare.plan.evacuation import with_evacuation
    from cmdare.plan.one_config import revocation_source
    from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup
    from cmdare.tasks import is_builtin_dataset
    from cmdare.train.run.controller_setup import EmulatedStepTimes, run_workload
    from cmdare.train.run.run_start import server_specs

    revocations = spec.revocations if spec.transient or spec.ps_transient else "none"
    if joined and revocations in (None, "none") and (spec.transient or spec.ps_transient):
        revocations = None  # nothing injected: a real cluster's spot servers are revoked by their market
    lifetime, _, plan = revocation_source(revocations, "auto", spec.seed, emulated=not joined)
    workers, _ = server_specs(spec)
    region = workers[0].region
    precision = spec.precision if joined else "fp32"  # see _NOT_SIMULATED_LOCAL
    shards = spec.ps if spec.topology == "ps" else 0  # an all-reduce run has no parameter server
    models = with_evacuation(load_plan_models(spec.model_name, lifetime, None, spec.cloud,
                                              input_shape=_input_shape(spec), batch_size=spec.batch_size,
                                              precision=precision),
                             spec.ps_transient)
    if not (spec.dataset == "cifar10" and is_builtin_dataset(spec.dataset)):
        source = models.source.replace("accuracy: ICAC 2019 ResNet-32/CIFAR-10 points",
                                       f"no accuracy predicted on {spec.dataset} (the accuracy points are CIFAR-10's)")
        models = dataclasses.replace(models, accuracy=None, source=source)
    if not joined:
        workload, measured_s = run_workload(spec) if plan.step_s is None else (spec.model_name, None)
        step_s = EmulatedStepTimes(workload, plan.step_s if plan.step_s is not None else measured_s,
                                   tuple(spec.slot_gpus()), spec.batch_size)
        fixed = None if spec.startup == "model" else float(spec.startup)
        models = emulated_models(models, step_s, sync=spec.sync, speedup=plan.speedup, startup_s=fixed)
        if fixed is None:  # start-ups drawn as the trainer draws them: its phases, its stream
            first_wave = [(None, spec.ps_transient)] * shards + [(g, spec.transient) for g in spec.slot_gpus()]
            models = dataclasses.replace(models, startup=TrainerStartups(plan.speedup, spec.seed, first_wave))
    counts = Counter(spec.slot_gpus())
    cluster = ClusterSpec(tuple(WorkerGroup(g, n, spec.transient, region) for g, n in counts.items()), ps=shards,
                          region=region, ps_transient=spec.ps_transient, replacement=spec.replace,
                          replacement_timeout_s=spec.replacement_timeout_s if joined else None,
                          warm_spares=spec.warm_spares, topology=spec.topology)
    job = JobSpec(spec.model_name, spec.steps, spec.checkpoint_every or spec.steps + 1, lr_policy=spec.lr_policy,
                  sync=spec.sync, batch_size=spec.batch_size, precision=precision)

    def sources() -> tuple[Any, Any]:
        factory, parsed = revocation_source(revocations, lifetime, spec.seed, emulated=not joined)[1:]
        if not joined and factory is None and parsed.lifetime is not None:
            factory = emulated_lifetimes(parsed)
        return factory, parsed

    return job, cluster, models, sources


def emulated_lifetimes(plan: Any) -> Any:
    """A local run's injected lifetimes as its trainer draws them (``build_revocation_source``: the same model,
    compression and random stream), so that the first simulated run with a seed revokes the servers the emulated run
    with that seed revokes; each further run draws from a stream of its own."""
    from itertools import count

    import numpy as np

    from cmdare.control import build_revocation_source

    runs = count()

    def source() -> Any:
        i = next(runs)
        return build_revocation_source(plan, np.random.default_rng(plan.seed if i == 0 else [plan.seed, i]))

    return source


def simulate_train(spec: TrainSpec, runs: int, as_json: bool, joined: bool) -> None:
    """Simulate ``runs`` runs of what ``cmdare train`` would start with ``spec``, and print the result (a table,
    or one JSON object)."""
    from cmdare.errors import UserInputError
    from cmdare.plan.one_config import print_simulation, simulate_configuration

    if runs < 1:
        raise UserInputError(f"--runs must be at least 1, got {runs}")
    job, cluster, models, sources = simulation_inputs(spec, joined)
    result, _ = simulate_configuration(job, cluster, models, sources, runs, spec.seed)
    clock = "real cloud time (a joined cluster)" if joined else "emulated cloud time (a local run)"
    out = {"model": spec.model_name, "dataset": str(spec.dataset), "steps": spec.steps, **result,
           "transient": spec.transient, "cloud": spec.cloud, "revocations": spec.revocations or "none",
           "clock": clock, "models": models.source, "not_simulated": unsimulated_options(spec, joined)}
    out["notes"] = [f"simulated in {clock}: the run trains nothing"]
    out["notes"] += [f"not simulated: {', '.join(out['not_simulated'])}"] if out["not_simulated"] else []
    if as_json:
        typer.echo(json.dumps(out, default=str))
        return
    print_simulation(out, f"{cluster.label()}: {spec.model_name}, {spec.steps} steps, {runs} runs (seed {spec.seed})",
                     cents=True)


def against_plan(report: Any, store: Any, run_id: str, runs: int = 100) -> None:
    """Add to ``report`` (``report run``) the table ``against_plan``: the run's cost, revocations, replacements
    and (joined: real time) time beside ``runs`` simulations of the command line it ran with."""
    import pandas as pd

    from cmdare.errors import UserInputError
    from cmdare.measure.store.schema import Run
    from cmdare.plan.one_config import simulate_configuration

    with store.session() as s:
        run = s.get(Run, run_id)
        config = dict(run.config or {}) if run is not None else {}
    if not config.get("model"):
        raise UserInputError(f"run {run_id} recorded no training options (an imported run?): nothing to simulate")
    spec = TrainSpec.from_dict(config)
    joined = config.get("provider") == "ray"
    job, cluster, models, sources = simulation_inputs(spec, joined)
    out, _ = simulate_configuration(job, cluster, models, sources, runs, spec.seed)
    got = dict(zip(report.tables["summary"].field, report.tables["summary"].value, strict=True))
    rows = [("cost_usd", float(got.get("cost_usd", "nan")), out["cost_usd"]),
            ("revocations", float(got.get("revocations", "nan")), {"mean": out["revocations_mean"]}),
            ("replacements", float(got.get("replacements", "nan")), {"mean": out["replacements_mean"]})]
    if joined:  # a local run's time is emulated cloud time, which the store does not keep
        rows.insert(0, ("time_s", float(got.get("wall_s", "nan")), out["time_s"]))
    report.tables["against_plan"] = pd.DataFrame(
        [{"measure": name, "run": value, "simulated_mean": sim["mean"], "simulated_p50": sim.get("p50"),
          "simulated_p95": sim.get("p95"), "run_over_mean": value / sim["mean"] if sim["mean"] else None}
         for name, value, sim in rows])
    clock = "real cloud time" if joined else "emulated cloud time"
    parts = int(got.get("parts", 1))
    report.notes.append(f"against the plan: {runs} simulated runs of this run's options in {clock} (seed "
                        f"{spec.seed}), one run to step {spec.steps}" + (f"; the run was trained in {parts} parts"
                                                                         if parts > 1 else ""))
    unhonoured = unsimulated_options(spec, joined)
    if unhonoured:
        report.notes.append(f"not simulated: {', '.join(unhonoured)}")


def register(app: typer.Typer) -> None:
    """Give ``cmdare train --simulate`` and ``cmdare report run --against-plan`` the simulator (``train`` and
    ``measure`` may not import the planner)."""
    from cmdare.measure import commands as measure_commands
    from cmdare.train.cli import train_cmd as commands

    commands.SIMULATE = simulate_train
    measure_commands.AGAINST_PLAN = against_plan
