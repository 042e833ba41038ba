"""``cmdare plan`` (recommend a cluster) and ``cmdare plan simulate`` (what-if for one cluster).

``plan`` is a Typer sub-app: its callback runs the recommender when no subcommand is given, so both
``cmdare plan --model resnet32 --steps 64000 --deadline 2h`` and ``cmdare plan simulate ...`` work.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cmdare.errors import UserInputError
from cmdare.option_values import DEFAULT_BATCH_SIZE, check_number
from cmdare.plan.evacuation import ps_markets, with_evacuation
from cmdare.plan.options import (
    check_names,
    check_offered,
    cloud_name,
    parse_deadline_s,
    retired_gpus,
    retired_note,
    split_names,
    start_hour_option,
)
from cmdare.plan.plan_output import print_rec, rec_json

ALLREDUCE_ACCURACY_NOTE = (
    "all-reduce accuracy: predicted as synchronous training (no stale gradients, a step of one batch per member, "
    "the same samples seen as the PS run); the accuracy model has no large-batch data, so what a large global "
    "batch loses is not predicted")

plan_app = typer.Typer(
    name="plan",
    help="Which cluster to rent: simulate configurations under revocations and recommend one.",
    invoke_without_command=True,
    no_args_is_help=False,
)

_MODEL_OPTION = typer.Option("--model", help="A model of `cmdare workloads`: t2t_resnet32 (measured by CM-DARE), "
                             "resnet32 (He's, predicted from its profile) ...")
def _models(model: str, lifetime: str, catalog: str | None, cloud: str, rate: str | None = None,
            model_error: bool = False, input_shape: str | None = None, batch_size: int | None = None,
            precision: str = "fp32", link_gbps: float | None = None):
    from cmdare.plan.adapters import load_plan_models
    from cmdare.workloads.commands import parse_shape

    return load_plan_models(model, lifetime, catalog, cloud, rate, model_error=model_error,
                            input_shape=parse_shape(input_shape) if input_shape else None, batch_size=batch_size,
                            precision=precision, link_gbps=link_gbps)


def _without_precision(gpus: list[str], precision: str) -> list[str]:
    """The GPU types among ``gpus`` that lack the arithmetic ``precision`` needs."""
    from cmdare.predict.generations import supports_precision

    return [g for g in gpus if not supports_precision(g, precision)]


def _topologies(text: str) -> tuple[str, ...]:
    """``--topologies``: ``ps``, ``allreduce``, both (a comma list), or ``both``."""
    from cmdare.option_values import check_topology

    names = ["ps", "allreduce"] if text.strip().lower() == "both" else split_names(text)
    if not names:
        raise UserInputError("--topologies needs ps, allreduce or both")
    return tuple(dict.fromkeys(check_topology(n) for n in names))


def _ps_of(rec: Any, chosen: Any) -> int:
    """The shards a PS run of the chosen workers has: the chosen cluster's, else those of the best PS option on
    the same workers (1 when none was priced)."""
    if chosen.topology == "ps":
        return chosen.ps
    same = [o for o in rec.options
            if o.cluster.topology == "ps" and o.cluster.ps and o.cluster.workers == chosen.workers]
    return min(same, key=lambda o: o.point[0] * o.point[1]).cluster.ps if same else 1


_Lifetime = Annotated[str, typer.Option(
    "--lifetime", help="auto (each offering's market model: GCE preemptible bathtub; spot: the fit of a preemption "
    "trace where one exists, else exponential at the catalog's interruption rate), or for every server: bathtub, "
    "exponential, empirical, a file, or none.")]
_ModelError = Annotated[bool, typer.Option(
    "--model-error/--no-model-error",
    help="Also draw each run's speed from the speed model's calibrated prediction interval (model error "
         "in the P95, not only revocations).")]
_Rate = Annotated[str | None, typer.Option(
    "--interruption-rate", help="Spot interruption rate overriding the catalog's (--lifetime auto): 8%/month, 2%/day "
    "or an AWS band <5%, 5-10%, 10-15%, 15-20%, >20%.")]
_CkptEvery = Annotated[int, typer.Option("--checkpoint-every", help="Steps between checkpoints.")]
_InputShape = Annotated[str | None, typer.Option(
    "--input-shape", help="Your own model (an import path): one sample's shape, e.g. 32 (default: 3,32,32).")]
_BatchSize = Annotated[int, typer.Option(
    "--batch-size", help="Per-worker batch size the run will train with: the step time and the accuracy are "
    f"predicted at it (default: cmdare train's, {DEFAULT_BATCH_SIZE}).")]
_Precision = Annotated[str, typer.Option(
    "--precision", help="What the workers will train in: fp32 (TF32 convolutions from Ampere on), amp-bf16 (GPUs from "
    "Ampere on) or amp-fp16 (from Pascal on); the step time is predicted for it.")]
_Deadline = Annotated[str | None, typer.Option("--deadline", help="e.g. 2h, 90min, or a clock time.")]
_Catalog = Annotated[str | None, typer.Option("--catalog", help="Price catalog file or name (icac2019).")]
_Cloud = Annotated[str, typer.Option("--cloud", help="Cloud whose prices apply: gcp or aws.")]
_PsTransient = Annotated[bool, typer.Option("--ps-transient", help="Put the PS on transient VMs.")]
_StartHour = Annotated[
    int | None,
    typer.Option(
        "--start-hour",
        help="Hour of day 0-23 (US Pacific) the job starts: lifetimes then depend on the hour each server "
        "is launched. Default: hour-agnostic lifetimes.",
    ),
]


def _source(models, start_hour: int | None, gpus: list[str]) -> str:
    from cmdare.predict.generations import step_time_basis
    from cmdare.predict.refine import refinement_note

    basis = step_time_basis(gpus)
    source = f"{models.source}; {refinement_note()}" + (f"; {basis}" if basis else "")
    if start_hour is None:
        return source
    return f"{source}; lifetimes by launch hour, job starts {start_hour:02d}:00 US Pacific"


@plan_app.callback()
def plan(
    ctx: typer.Context,
    model: Annotated[str | None, _MODEL_OPTION] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Global training steps.")] = None,
    deadline: _Deadline = None,
    budget: Annotated[float | None, typer.Option("--budget", help="USD the run may cost.")] = None,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", help="GPU types to consider (default: p100,v100,t4 where the cloud offers them; K80, retired, "
        "only when named here or with --include-retired).")] = None,
    include_retired: Annotated[bool, typer.Option(
        "--include-retired", help="Also consider the GPU types the cloud has retired (K80) by default.")] = False,
    regions: Annotated[str | None, typer.Option(
        "--regions", help="Regions to consider (default: the cloud's region offering most of the GPUs).")] = None,
    max_workers: Annotated[int, typer.Option("--max-workers", help="Most workers per cluster.")] = 8,
    max_ps: Annotated[int, typer.Option("--max-ps", help="Most parameter servers.")] = 3,
    mixes: Annotated[bool, typer.Option("--mixes/--no-mixes", help="Also mixes of two GPU types.")] = True,
    runs: Annotated[int, typer.Option("--runs", help="Monte Carlo runs per configuration.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    lifetime: _Lifetime = "auto",
    interruption_rate: _Rate = None,
    model_error: _ModelError = False,
    checkpoint_every: _CkptEvery = 1000,
    catalog: _Catalog = None,
    cloud: _Cloud = "gcp",
    plot: Annotated[str | None, typer.Option("--plot", help="Write the Pareto plot PNG here (.svg, .pdf: that "
                                             "format), a new file unless --force.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --plot file (a symbolic link is "
                                        "replaced, never followed).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the front and the choice as JSON.")] = False,
    min_accuracy: Annotated[
        float | None,
        typer.Option("--min-accuracy", help="Keep configurations predicted to reach this final accuracy, e.g. 0.91."),
    ] = None,
    start_hour: _StartHour = None,
    input_shape: _InputShape = None,
    batch_size: _BatchSize = DEFAULT_BATCH_SIZE,
    precision: _Precision = "fp32",
    ps_market: Annotated[str, typer.Option(
        "--ps-market", help="Parameter servers on on-demand servers, spot servers (evacuated within their "
        "notice), or any: both, compared.")] = "on-demand",
    link_gbps: Annotated[float, typer.Option(
        "--link-gbps", help="Network per server in Gbit/s: a PS's transfers and an all-reduce ring take it (10: the "
        "network CM-DARE's PS runs are taken to have had).")] = 10.0,
    topologies: Annotated[str, typer.Option(
        "--topologies", help="How each candidate cluster may train, all priced: ps (through parameter servers), "
        "allreduce (every worker holds the model; --steps/n group steps of n members train the same batches), or "
        "both.")] = "ps,allreduce",
) -> None:
    """Recommend a cluster: the cheapest meeting --deadline, or the fastest within --budget; with
    --min-accuracy only among configurations predicted to train accurately enough."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None or steps is None:
        raise UserInputError("cmdare plan needs --model and --steps (or a subcommand: simulate)")
    from cmdare.plan.recommender import enumerate_clusters, recommend
    from cmdare.plan.spec import JobSpec

    deadline_s = parse_deadline_s(deadline) if deadline is not None else None
    if budget is not None and budget < 0:
        raise UserInputError(f"the budget must not be negative, got {budget}")
    if runs < 1:
        raise UserInputError(f"--runs must be at least 1, got {runs}")
    link_gbps = check_number(link_gbps, "--link-gbps", 1e-3, 1e4, "Gbit/s")
    priced = _topologies(topologies)
    if min_accuracy is not None and not 0 < min_accuracy <= 1:
        raise UserInputError(f"--min-accuracy is a fraction in (0, 1], e.g. 0.91 for 91%; got {min_accuracy}")
    if plot:
        from cmdare.output_files import check_figure_output

        check_figure_output(plot, "--plot", force)  # fail before minutes of simulation, not after
    job = JobSpec(model, steps, checkpoint_every, batch_size=batch_size, start_hour=start_hour_option(start_hour),
                  precision=precision)
    cloud = cloud_name(cloud)
    models = with_evacuation(_models(model, lifetime, catalog, cloud, interruption_rate, model_error, input_shape,
                                     batch_size, precision, link_gbps), ps_market != "on-demand")
    gpu_list = split_names(gpus) if gpus is not None else models.prices.default_gpus()
    if gpus is not None:
        check_names(models.prices, gpu_list, [])
    left_out = [] if gpus is not None or include_retired else retired_gpus(models.prices, gpu_list)
    no_path = _without_precision([g for g in gpu_list if g not in left_out], precision)
    gpu_list = [g for g in gpu_list if g not in left_out and g not in no_path]
    if no_path and not gpu_list:
        raise UserInputError(f"--precision {precision}: none of {', '.join(g.upper() for g in no_path)} has the "
                             "arithmetic for it (bf16 needs Ampere or newer: a100, l4, h100; fp16 Pascal or newer)")
    region_list = split_names(regions) if regions is not None else [models.prices.default_region(gpu_list)]
    if not gpu_list or not region_list:
        raise UserInputError("--gpus and --regions need at least one name each")
    check_names(models.prices, gpu_list, region_list)
    retired = retired_gpus(models.prices, gpu_list)
    notes = [retired_note(retired, cloud)] if retired else []
    if left_out:
        them = "them" if len(left_out) > 1 else "it"
        notes.append(retired_note(left_out, cloud, f"left out of this plan (--include-retired or --gpus "
                                                    f"{','.join([*left_out, *gpu_list])} to consider {them})"))
    if no_path:
        notes.append(f"{', '.join(g.upper() for g in no_path)} left out: no {precision[4:]} arithmetic for --precision "
                     f"{precision}")
    clusters = [
        c for c in enumerate_clusters(gpu_list, region_list, max_workers, max_ps, mixes,
                                      ps_markets=ps_markets(ps_market), topologies=priced)
        if all(models.prices.offered(g.gpu, g.region, g.transient) for g in c.workers)
        and models.prices.offered("cpu", c.region, c.ps_transient)
    ]
    if not clusters:
        raise UserInputError(f"none of {gpus} is offered in {regions} on {cloud}")
    rec = recommend(job, clusters, models, deadline_s, budget, runs, seed, min_accuracy=min_accuracy)
    topology = None
    if models.accuracy is not None and any(o.cluster.topology == "allreduce" for o in rec.front):
        notes.append(ALLREDUCE_ACCURACY_NOTE)
    if rec.choice is not None and rec.choice.cluster.n_workers > 1:
        from cmdare.plan.topology_choice import topology_choice
        from cmdare.predict.workloads import workload_features
        from cmdare.workloads.commands import parse_shape

        features = workload_features(model, parse_shape(input_shape) if input_shape else None)
        chosen = rec.choice.cluster
        said, topology = topology_choice(features, chosen.gpu_counts, _ps_of(rec, chosen), link_gbps,
                                         chosen.topology, priced, batch_size, precision)
        notes.append(said)
    if plot:
        from cmdare.plan.plot import plot_pareto

        plot_pareto(rec, plot, deadline_s, budget, force)
    if as_json:
        out = rec_json(rec, models.lifetimes, retired, job, cloud)
        out.update(retired_gpus=retired, left_out_retired_gpus=left_out, notes=notes, topology=topology)
        typer.echo(json.dumps(out, indent=2))
        return
    print_rec(rec, _source(models, start_hour, gpu_list), plot, models.lifetimes, retired, notes, job, cloud)


@plan_app.command("simulate")
def simulate_cmd(
    model: Annotated[str, _MODEL_OPTION],
    steps: Annotated[int, typer.Option("--steps", help="Global training steps.")],
    workers: Annotated[str, typer.Option(
        "--workers", help="Workers: a mix such as v100:8 or v100:1,p100:1,k80:2, or a count of T4s (the default GPU, "
        "named in the output), e.g. 8.")],
    ps: Annotated[int | None, typer.Option("--ps", help="Parameter servers (default 1; 0: single-server "
                                           "training).")] = None,
    topology: Annotated[str, typer.Option(
        "--topology", help="ps (through parameter servers) or allreduce (every worker holds the model; the group "
        "re-forms on a loss and heals a newcomer from a peer; no --ps).")] = "ps",
    input_shape: _InputShape = None,
    batch_size: _BatchSize = DEFAULT_BATCH_SIZE,
    precision: _Precision = "fp32",
    transient: Annotated[bool, typer.Option("--transient/--on-demand", help="Worker pricing.")] = False,
    ps_transient: _PsTransient = False,
    region: Annotated[str | None, typer.Option(
        "--region", help="Region of every server (default: the cloud's region offering the GPUs).")] = None,
    replacement: Annotated[str, typer.Option(
        "--replacement", "--replace", help="Replacement policy for a lost worker: same | cheapest | none.")] = "same",
    replacement_timeout: Annotated[float | None, typer.Option(
        "--replacement-timeout", help="Seconds a replacement may wait for spot capacity and start up before the "
        "policy falls back (cheapest: another GPU type), as for cmdare train (default: it waits).")] = None,
    revocations: Annotated[str | None, typer.Option(
        "--revocations", help="As for cmdare train: lifetime=MODEL | every=S[,first=F] | trace=T@SLOT+... | "
        "trace=FILE | none (default: lifetime=the --lifetime model).")] = None,
    trace: Annotated[str | None, typer.Option(
        "--trace", help="Replay a revocation trace file (CSV time_s,server,event or Can't Be Late JSON), as "
        "--revocations trace=FILE.")] = None,
    lr_policy: Annotated[str, typer.Option(
        "--lr-policy", help="LR on membership change: unchanged | linear | sqrt | staleness.")] = "unchanged",
    warm_spares: Annotated[int, typer.Option(
        "--warm-spares", help="Standby servers, billed like workers: a replacement takes one instead of starting "
        "cold, and another starts in its place (as for cmdare train).")] = 0,
    runs: Annotated[int, typer.Option("--runs", help="Monte Carlo runs.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    lifetime: _Lifetime = "auto",
    interruption_rate: _Rate = None,
    model_error: _ModelError = False,
    checkpoint_every: _CkptEvery = 1000,
    catalog: _Catalog = None,
    cloud: _Cloud = "gcp",
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
    start_hour: _StartHour = None,
) -> None:
    """Simulate one configuration: mean, P50 and P95 time and cost, revocations and replacements."""
    from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, default_gpu_note
    from cmdare.cloud.gpu_counts import parse_workers as read_workers
    from cmdare.plan.one_config import print_simulation, revocation_source, simulate_configuration
    from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup

    if runs < 1:
        raise UserInputError(f"--runs must be at least 1, got {runs}")
    job = JobSpec(model, steps, checkpoint_every, batch_size=batch_size, start_hour=start_hour_option(start_hour),
                  lr_policy=lr_policy, precision=precision)
    if trace is not None:
        if revocations is not None:
            raise UserInputError("give --trace FILE or --revocations, not both")
        revocations = f"trace={trace}"
    lifetime, _, _ = revocation_source(revocations, lifetime, seed)
    cloud = cloud_name(cloud)
    models = with_evacuation(_models(model, lifetime, catalog, cloud, interruption_rate, model_error, input_shape,
                                     batch_size, precision), ps_transient)
    asked = read_workers(workers, models.prices.catalog)
    counts = asked.counts(DEFAULT_WORKER_GPU)
    check_names(models.prices, list(counts), [])
    from cmdare.predict.generations import check_precision_on

    for gpu in counts:
        check_precision_on(gpu, precision)
    region = region or models.prices.default_region(list(counts))
    groups = tuple(WorkerGroup(gpu, n, transient, region) for gpu, n in counts.items())
    cluster = ClusterSpec(groups, ps=(1 if topology == "ps" else 0) if ps is None else ps, region=region,
                          ps_transient=ps_transient, replacement=replacement, replacement_timeout_s=replacement_timeout,
                          warm_spares=warm_spares, topology=topology)
    check_names(models.prices, list(counts), [region])
    retired = retired_gpus(models.prices, list(counts))
    check_offered(models.prices, list(counts), region, transient)
    notes = [] if asked.mix is not None else [default_gpu_note(asked.total, DEFAULT_WORKER_GPU, cloud)]
    notes += [retired_note(retired, cloud)] if retired else []
    if topology == "allreduce":
        notes.append(f"all-reduce: a step trains one batch per member ({cluster.n_workers} batches with every member "
                     "up; a smaller group covers a step's samples in more of its own steps); a lost member costs a "
                     "re-formation and a heal from a peer; cmdare train --topology allreduce trains it")
        notes += [ALLREDUCE_ACCURACY_NOTE] if models.accuracy is not None else []
    result, _ = simulate_configuration(job, cluster, models, lambda: revocation_source(revocations, lifetime, seed)[1:],
                                       runs, seed)
    out = {"model": model, "steps": steps, **result, "transient": transient, "cloud": cloud,
           "catalog": catalog or "default", "revocations": revocations or f"lifetime={lifetime}",
           "start_hour": start_hour, "models": _source(models, start_hour, list(counts)), "retired_gpus": retired,
           "notes": notes}
    if as_json:
        typer.echo(json.dumps(out))
        return
    flag = f" (retired: {', '.join(g.upper() for g in retired)})" if retired else ""
    print_simulation(out, f"{cluster.label()}{flag}: {model}, {steps} steps, {runs} runs (seed {seed})")


def register(app: typer.Typer) -> None:
    """Add ``cmdare plan``, ``cmdare plan simulate`` and ``cmdare catalog`` to the main app."""
    from cmdare.plan.catalog_command import catalog_command

    app.add_typer(plan_app, name="plan")
    app.command("catalog")(catalog_command)
