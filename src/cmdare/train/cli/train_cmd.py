"""``cmdare train``: a training run on a local Ray instance or an existing Ray cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from cmdare.errors import UserInputError
from cmdare.events import EventReport, RunSummary, TrainCallback
from cmdare.option_values import DEFAULT_BATCH_SIZE

console = Console(soft_wrap=True)

# The main job shows the transient path: each server lives a bathtub-distributed GCE lifetime, the cloud's
# clocks 7200x faster than training in emulated time (docs/controller.md): a 24 h lifetime is 12 emulated
# seconds, about 330 steps of two K80 workers on resnet15, so a 500-step run sees a few servers revoked and
# replaced, at the same steps on any machine.
DEFAULT_REVOCATIONS = "lifetime=bathtub,speedup=7200"
DEFAULT_CHECKPOINT_EVERY = 200
# A PS revoked without notice rolls every shard back to the last checkpoint: with spot PS servers the
# default interval is a quarter of the usual, so such a loss is at most 50 steps (the background upload
# keeps the chief's stall per checkpoint near 30 ms, docs/benchmarks.md), 1/4 of the on-demand bound.
PS_TRANSIENT_CHECKPOINT_EVERY = 50


#: What ``--simulate`` runs: (spec, runs, as_json, joined) -> None. Set by :mod:`cmdare.run_simulation`, which may
#: import the planner (this module may not).
SIMULATE: Callable[[Any, int, bool, bool], None] | None = None


def default_revocations(revocations: str | None, address: str | None) -> str:
    """The ``--revocations`` a run uses: as given; else the emulated default locally, none when joined."""
    if revocations is not None:
        return revocations
    return "none" if address else DEFAULT_REVOCATIONS


def train_command(
    ctx: typer.Context,
    model: str = typer.Option("resnet15", help="Workload name (see `cmdare workloads`), or your model factory's "
                              "import path, e.g. mypkg.models:build_net."),
    dataset: str = typer.Option("digits", help="digits | synthetic | cifar10, or your dataset's import path "
                                "(a map-style Dataset, a DataLoader or a factory of one; e.g. mypkg.data:make_sets)."),
    loss: str = typer.Option(None, help="Your loss function's import path, e.g. torch.nn.functional:mse_loss "
                             "(default: cross-entropy)."),
    metric: str = typer.Option(None, help="Your metric's import path: metric(output, target) -> a number or a dict "
                               "of numbers, the batch mean (default: accuracy on a built-in dataset)."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Directory of the CIFAR-10 python batches."),
    workers: str = typer.Option("2", help="Workers: a number (that many of --gpu) or a GPU mix, e.g. "
                                "k80:2,v100:1 (each worker on a server of its type and price)."),
    ps: int = typer.Option(1, "--ps", help="Number of parameter shards."),
    steps: int = typer.Option(500, help="Target global step."),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, help="Per-worker batch size."),
    precision: str = typer.Option("fp32", "--precision", help="fp32; amp-bf16: the forward pass and the loss "
                                  "in bfloat16 (torch.autocast; GPUs from Ampere on, and CPUs); amp-fp16: the same "
                                  "in float16 with dynamic loss scaling (GPUs from Pascal on; a PS worker pushes after "
                                  "backward; a gradient with an overflow is skipped, with all-reduce by every "
                                  "member alike). Parameters and gradients stay float32."),
    lr: float = typer.Option(0.05, help="Learning rate."),
    momentum: float = typer.Option(0.9, help="SGD momentum."),
    weight_decay: float = typer.Option(1e-4, help="Weight decay."),
    lr_schedule: str = typer.Option("constant", "--lr-schedule",
                                    help="constant, or cosine: the learning rate decays to 0 over --steps (a cosine "
                                    "of the global step)."),
    warmup_steps: int = typer.Option(0, "--warmup-steps",
                                     help="The learning rate rises linearly over the first N steps."),
    clip_grad_norm: float = typer.Option(None, "--clip-grad-norm",
                                         help="Clip the gradient to this L2 norm before each update: the group's "
                                         "averaged gradient with --topology allreduce, each worker's own before its "
                                         "push with a PS (which then pushes after backward)."),
    sync: bool = typer.Option(False, "--sync", help="Synchronous training (one aggregated gradient per step)."),
    placement: str = typer.Option("round-robin", help="Parameter placement strategy."),
    checkpoint_every: int = typer.Option(None, help="Checkpoint every N steps (0: never). Default "
                                         f"{DEFAULT_CHECKPOINT_EVERY}; {PS_TRANSIENT_CHECKPOINT_EVERY} with "
                                         "--ps-transient (a PS revoked without notice loses at most that many "
                                         "steps)."),
    eval_every: int = typer.Option(100, help="Evaluate every N steps (0: only at the end)."),
    seed: int = typer.Option(0, help="Random seed."),
    resume: str = typer.Option(None, help="Resume run RUN from its latest checkpoint, with the options it ran "
                               "with (options given here override them)."),
    from_step: int = typer.Option(None, help="With --resume: the checkpoint of step N instead of the latest "
                                  "(when the latest is missing or corrupt, resuming from an older one is a choice "
                                  "made here)."),
    storage: str = typer.Option(None, envvar="CMDARE_STORAGE",
                                help="Where checkpoints and the run's control files go: a directory or a URL "
                                "(s3://bucket/prefix, gs://bucket/prefix, any fsspec URL). Default: the data "
                                "directory. On a cluster, use storage every machine reaches."),
    address: str = typer.Option(None, help="Join this Ray cluster ('auto' on a cluster node); it must be one that "
                                "'cmdare cluster-config' describes, unless --any-cluster."),
    any_cluster: bool = typer.Option(False, "--any-cluster",
                                     help="With --address: train on a Ray cluster that cmdare did not start."),
    gpus_per_worker: str = typer.Option("auto", help="GPUs per worker (Ray num_gpus); auto: one when the "
                                        "cluster has GPUs, else none."),
    transient: bool = typer.Option(True, "--transient/--on-demand",
                                   help="Workers on transient (spot/preemptible) servers, or on-demand ones."),
    ps_transient: bool = typer.Option(False, "--ps-transient",
                                      help="Parameter servers on transient servers too: injected revocations "
                                      "hit them after a notice (notice=S in --revocations), in which each "
                                      "shard's blocks move to the other shards or a replacement."),
    gpu: str = typer.Option("k80", help="GPU type of the worker servers (priced from the catalog)."),
    cloud: str = typer.Option("gcp", help="Cloud whose prices the servers take: gcp | aws."),
    region: str = typer.Option(None, help="Region (default: the first region offering the GPU)."),
    revocations: str = typer.Option(
        None, help="Injected revocations: lifetime=MODEL|auto[,speedup=S][,seed=N] | every=S[,first=F] | "
        "trace=T@SLOT+... (SLOT 'ps': a PS server) | trace=FILE | none, and [,hit=all|workers|ps][,notice=S] "
        "(a PS server's notice lead, default the cloud's 30 s/120 s over speedup). "
        f"Default: {DEFAULT_REVOCATIONS} on a local run; none on a joined cluster (--address: real servers are "
        "revoked by their cloud, never by emulation unless asked)."),
    replace: str = typer.Option("same", "--replacement", "--replace",
                                help="Replacement policy for a lost worker: same | cheapest | none."),
    startup: str = typer.Option("model", help="Emulated replacement start-up (local runs): 'model' (CM-DARE "
                                "data) or seconds. A joined cluster's start-up is measured, never emulated."),
    replacement_timeout: float = typer.Option(600.0, "--replacement-timeout",
                                              help="Joined cluster: seconds a replacement may wait for the "
                                              "autoscaler's node before the policy falls back (cheapest: "
                                              "another GPU type) or the run trains on without it."),
    warm_spares: int = typer.Option(0, "--warm-spares",
                                    help="Standby servers whose worker process is started (torch imported, data "
                                    "read, model built) but trains nothing: a replacement takes one and skips the "
                                    "cold start; a new one starts in its place. Each is billed like a worker."),
    lr_policy: str = typer.Option("unchanged", help="LR on membership change: unchanged | linear | sqrt | staleness."),
    elastic_ps: bool = typer.Option(False, "--elastic-ps", help="Let the PSLD balancer add and remove shards."),
    balance_every: int = typer.Option(50, help="Steps between load-balancing decisions."),
    straggler: str = typer.Option(None, help="Slow one shard down, SHARD:FACTOR (e.g. 0:3), for experiments."),
    auto_mitigate: bool = typer.Option(False, "--auto-mitigate",
                                       help="Act on detected bottlenecks: add a PS shard, unload a straggler."),
    ps_bandwidth: str = typer.Option(None, help="Emulate each PS server's network link, e.g. 1Gbit/s or 200MB/s "
                                     "(each push and reply take bytes/bandwidth on the shard)."),
    overlap: bool = typer.Option(True, "--overlap/--no-overlap",
                                 help="Send each piece of a gradient as soon as backward has produced it "
                                 "(with --ps-bandwidth, or through Ray to shards of 4 MiB or more); on a "
                                 "same-node channel an asynchronous shard sends the piece's parameters back "
                                 "at once, so push and pull overlap backward. --no-overlap pushes after "
                                 "backward, as --precision amp-fp16 always does."),
    on_diverge: str = typer.Option("stop", "--on-diverge",
                                   help="A NaN or infinite loss: 'stop' ends the run (failed); 'rollback' "
                                   "(3 times) or 'rollback:N' rolls the shards back to the newest stored checkpoint, "
                                   "scales the learning rate by --rollback-lr-scale and trains on."),
    rollback_lr_scale: float = typer.Option(0.5, "--rollback-lr-scale",
                                            help="Learning-rate multiplier of each rollback (1: unchanged)."),
    async_momentum: str = typer.Option("compensate", "--async-momentum",
                                       help="Asynchronous workers add momentum of their own (about 1 - 1/workers): "
                                       "'compensate' applies --momentum reduced by it (0.9 with 2 workers: 0.4), "
                                       "'keep' applies --momentum as given."),
    bn_samples: int = typer.Option(512, "--bn-samples",
                                   help="Batch-norm statistics of what the run evaluates, checkpoints and exports: "
                                   "recomputed for that step's parameters from this many training samples; 0 keeps "
                                   "the chief's own running statistics."),
    record: bool = typer.Option(True, "--record/--no-record", help="Record measurements in the store."),
    tensorboard: str = typer.Option(None, help="TensorBoard directory (default: the data directory's "
                                    "tensorboard/RUN); 'none' to skip."),
    simulate: bool = typer.Option(False, "--simulate",
                                  help="Train nothing: simulate the run these options would start (--runs seeded "
                                  "runs from --seed): time, cost, revocations. A local run is simulated in its "
                                  "emulated cloud time; options the simulator cannot honour are named."),
    runs: int = typer.Option(100, "--runs", help="With --simulate: Monte Carlo runs."),
    as_json: bool = typer.Option(False, "--json", help="With --simulate: print only JSON on stdout."),
    topology: str = typer.Option("ps", "--topology",
                                 help="ps: parameter servers (CM-DARE's asynchronous training); allreduce: every "
                                 "worker holds the whole model and the workers average their gradients each step "
                                 "in an elastic group that a lost server shrinks and a replacement heals "
                                 "(docs/allreduce.md)."),
    optimizer: str = typer.Option("sgd", "--optimizer",
                                  help="sgd (--momentum, --weight-decay), adamw (--lr, --weight-decay) or a "
                                  "torch.optim class by import path (module:Class), in both topologies: the "
                                  "shards run it on their blocks, all-reduce workers on the model."),
) -> None:
    """Train a CNN on Ray, through parameter servers or an elastic all-reduce group, and record measurements."""
    from cmdare.train.cli.progress import ProgressCallback
    from cmdare.train.spec import TrainSpec

    if elastic_ps and placement != "psld":
        raise UserInputError("--elastic-ps needs --placement psld (the PSLD balancer adds and removes shards)")
    if dataset == "cifar10" and data_dir is None:
        raise UserInputError("--dataset cifar10 needs --data-dir DIR (the CIFAR-10 python batches)")
    if from_step is not None and not resume:
        raise UserInputError("--from-step needs --resume RUN")
    # the options given on the command line, by name: Typer may bring its own copy of click, whose ParameterSource
    # is another enum
    explicit = {name for name in ctx.params
                if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}
    if explicit & {"runs", "as_json"} and not simulate:
        raise UserInputError("--runs and --json go with --simulate")
    if simulate and resume:
        raise UserInputError("--simulate simulates a new run; leave out --resume (or simulate the run's options)")
    if topology.strip().lower() == "allreduce":
        given = [f"--{name.replace('_', '-')}" for name in ("ps", "placement", "elastic_ps", "ps_transient",
                                                              "balance_every", "async_momentum", "overlap")
                 if name in explicit]
        if given:
            raise UserInputError(f"--topology allreduce has no parameter servers: {', '.join(given)} means nothing "
                                 "there; leave it out")
    num_workers, worker_gpus = TrainSpec.parse_workers(workers)
    gpus: float | str = gpus_per_worker.strip().lower()
    if gpus != "auto":
        try:
            gpus = float(gpus)
        except ValueError:
            raise UserInputError(f"--gpus-per-worker must be 'auto' or a number, got {gpus_per_worker!r}") from None
    spec = TrainSpec(model=model, dataset=dataset, loss=loss, metric=metric,
                     data_dir=str(data_dir) if data_dir else None, workers=num_workers,
                     worker_gpus=worker_gpus,
                     ps=ps, steps=steps, batch_size=batch_size, precision=precision, sync=sync,
                     placement=placement,
                     optimizer=_optimizer_config(lr, momentum, weight_decay, lr_schedule, warmup_steps, steps),
                     clip_grad_norm=clip_grad_norm,
                     checkpoint_every=checkpoint_every if checkpoint_every is not None else
                     PS_TRANSIENT_CHECKPOINT_EVERY if ps_transient else DEFAULT_CHECKPOINT_EVERY,
                     eval_every=eval_every, seed=seed, ps_transient=ps_transient,
                     gpus_per_worker=gpus, transient=transient, gpu=gpu, cloud=cloud, region=region,
                     revocations=default_revocations(revocations, address) if transient or ps_transient else None,
                     replace=replace,
                     startup=startup, replacement_timeout_s=replacement_timeout, warm_spares=warm_spares,
                     lr_policy=lr_policy, elastic_ps=elastic_ps, balance_every=balance_every, straggler=straggler,
                     auto_mitigate=auto_mitigate, ps_bandwidth=ps_bandwidth, overlap=overlap,
                     on_diverge=on_diverge, rollback_lr_scale=rollback_lr_scale, bn_samples=bn_samples,
                     async_momentum=async_momentum.strip().lower(),
                     storage=storage, topology=topology.strip().lower(), optimizer_name=optimizer.strip())
    if resume:
        from cmdare.storage import run_storage
        from cmdare.train.cli.resume import resumed_spec
        from cmdare.train.cli.runs_cmd import recorded_storage

        if storage is None and (storage := recorded_storage(resume)) is not None:
            spec = dataclasses.replace(spec, storage=storage)  # where the run was recorded to keep its files

        spec = resumed_spec(run_storage(resume, storage), spec, explicit, joined=address is not None)
    from cmdare.train.run.run_start import preflight

    preflight(spec)  # a mistake fails now, in one line, before torch and Ray load
    if simulate:
        if SIMULATE is None:
            raise RuntimeError("no simulator registered (cmdare.run_simulation)")
        SIMULATE(spec, runs, as_json, address is not None)
        return
    callbacks = [ProgressCallback(spec.steps), RunNotices()]
    where = "not recorded (--no-record)"
    if record:
        from sqlalchemy.engine import make_url

        from cmdare.measure.recorder import StoreRecorder
        from cmdare.paths import default_db_url

        url = default_db_url()
        callbacks.append(StoreRecorder(url))
        where = make_url(url).render_as_string(hide_password=True)
    from cmdare.paths import data_dir
    from cmdare.train.trainer import Trainer, new_run_id

    run_id = resume or new_run_id()
    # No option means the default directory; only an explicit 'none' turns TensorBoard off. (str(None) is
    # "none" too: testing str(tensorboard) against "none" skipped TensorBoard on every default run.)
    if tensorboard is None or tensorboard.strip().lower() != "none":
        from cmdare.measure.tensorboard import TensorBoardCallback

        tb_dir = Path(tensorboard).expanduser() if tensorboard else data_dir() / "tensorboard" / run_id
        callbacks.append(TensorBoardCallback(str(tb_dir)))
    trainer = Trainer(spec, callbacks, address=address, any_cluster=any_cluster, run_id=run_id,
                      resume=resume is not None, resume_step=from_step)
    summary = trainer.run()
    console.print(f"[bold]run {summary.run_id}[/] {summary.status}: step {summary.global_step} in "
                  f"{summary.wall_s:.1f} s, {test_line(summary)}")
    console.print(speed_line(summary), highlight=False)
    emulated = " (emulated servers: catalog prices over emulated cloud time)" if summary.details.get("emulated") else ""
    clock = "emulated cloud" if summary.details.get("clock") == "emulated" else "cluster"
    parts = summary.details.get("totals", {}).get("parts", 1)
    console.print(f"servers{', this part' if parts > 1 else ''}: {summary.revocations} revoked, "
                  f"{summary.replacements} replaced, {summary.details.get('time_lost_s', 0.0):.1f} s of {clock} time "
                  f"lost; cost {'of this part' if parts > 1 else 'so far'} ${summary.cost_usd:.4f}{emulated}")
    if parts > 1:
        console.print(totals_line(summary, clock), highlight=False)
    if spec.ps_transient or summary.details.get("steps_lost"):
        console.print(f"parameter servers: {summary.details.get('shards_evacuated', 0)} shards evacuated "
                      f"({summary.details.get('shards_parked', 0)} parked until their replacement was up), "
                      f"{summary.details.get('steps_lost', 0)} steps lost")
    if summary.details.get("rollbacks"):
        console.print(f"training diverged {summary.details['rollbacks']} time(s): rolled back to the newest stored "
                      f"checkpoint, {summary.details.get('steps_rolled_back', 0)} steps trained again")
    console.print(f"measurements: {where}; checkpoints: {summary.details.get('checkpoint_dir')}")
    if summary.details.get("failed_checkpoints"):
        console.print(f"[bold yellow]warning:[/] {summary.details['failed_checkpoints']} checkpoint upload(s) "
                      "failed (see the checkpoint_failed events); the previous checkpoints stayed valid")


def _optimizer_config(lr: float, momentum: float, weight_decay: float, schedule: str, warmup_steps: int,
                      steps: int) -> Any:
    """The optimizer's hyper-parameters and learning-rate schedule from the command line."""
    from cmdare.ps.optimizer_config import OptimizerConfig

    schedule = schedule.strip().lower()
    if schedule not in ("constant", "cosine"):
        raise UserInputError(f"--lr-schedule must be constant or cosine, got {schedule!r}")
    if warmup_steps < 0:
        raise UserInputError(f"--warmup-steps must not be negative, got {warmup_steps}")
    return OptimizerConfig(lr=lr, momentum=momentum, weight_decay=weight_decay, schedule=schedule,
                           warmup_steps=warmup_steps, total_steps=steps if schedule == "cosine" else 0)


def test_line(summary: RunSummary) -> str:
    """``test accuracy 0.953`` (a built-in dataset), or the test loss and metrics of your own task."""
    if summary.final_accuracy is not None:
        return f"test accuracy {summary.final_accuracy:.3f}"
    if summary.final_loss is None:
        return "no test data"
    metrics = "".join(f", {k} {v:.4g}" for k, v in summary.details.get("test_metrics", {}).items())
    return f"test loss {summary.final_loss:.4g}{metrics}"


def speed_line(summary: RunSummary) -> str:
    """How the run's time divides: steps trained at the run's speed, and the rest (start-up, checkpoints,
    the end); the figures multiply and add up."""
    first = int(summary.details.get("resumed_from_step") or 0)
    trained = max(0, summary.global_step - first)
    train_s = trained / summary.steps_per_s if summary.steps_per_s > 0 else 0.0
    since = f" (from step {first})" if first else ""
    return (f"training: {trained} steps{since} at {summary.steps_per_s:.1f} steps/s = {train_s:.1f} s; "
            f"start-up, checkpoints and the end {max(0.0, summary.wall_s - train_s):.1f} s")


def totals_line(summary: RunSummary, clock: str) -> str:
    """The run in all, over its parts (a run and its resumes): each part's steps, and the sums."""
    from cmdare.measure.run_parts import UNKNOWN

    t = summary.details["totals"]
    spans = ", ".join(f"{p['from_step']}-{p['to_step'] if p['to_step'] is not None else '?'}"
                      for p in summary.details.get("parts", []))
    wall = f" in {t['wall_s']:.1f} s" if t["wall_s"] is not None else ""
    why = {p["part"]: "trained before cmdare kept parts" if p["status"] == UNKNOWN else p["status"]
           for p in summary.details.get("parts", [])}
    missing = "".join(f"; part {n}'s cost and counts not known ({why.get(n, '?')})" for n in t["unknown_parts"])
    return (f"in all, {t['parts']} parts (steps {spans}): {t['steps_trained']} steps trained{wall}; "
            f"{t['revocations'] or 0} revoked, {t['replacements'] or 0} replaced, {t['time_lost_s'] or 0.0:.1f} s of "
            f"{clock} time lost; cost ${t['cost_usd'] or 0.0:.4f}{missing}")


class RunNotices(TrainCallback):
    """Prints ``resumed RUN from step N`` when a resumed run starts, the momentum applied for asynchronous
    workers, storage warnings and failed checkpoint uploads as they happen (on stderr: the first with its error,
    then a count)."""

    def __init__(self) -> None:
        self.failed_uploads = 0

    def on_event(self, report: EventReport) -> None:
        if report.kind == "resume":
            console.print(f"resumed {report.run_id} from step {report.details.get('step')}")
        elif report.kind == "shard_restored" and report.details.get("reason") == "diverged":
            d = report.details
            back = f"step {d.get('checkpoint_step')}, the newest stored checkpoint" if d.get("from_checkpoint") else \
                f"the start of the run (step {d.get('checkpoint_step')}: no checkpoint was stored yet)"
            _warn(f"training diverged ({d.get('why') or 'a non-finite loss'}): rolled back to {back}, learning rate "
                  f"x{d.get('lr_scale', 1.0):g} from now on (rollback {d.get('rollback')} of {d.get('max_rollbacks')})")
        elif report.kind == "regroup" and report.details.get("from_checkpoint") and report.details.get("reason"):
            d = report.details
            back = f"step {d.get('step')}" + (", the newest stored checkpoint" if d.get("checkpoint") is not None
                                              else " (no checkpoint was stored yet)")
            _warn(f"the all-reduce group went back to {back}: {d.get('why')}")
        elif report.kind == "async_momentum":
            d = report.details
            Console(stderr=True, soft_wrap=True).print(
                f"asynchronous workers: momentum {d['momentum']:g} applied as {d['applied']:.3g} ({d['workers']} "
                f"workers add about {1 - 1 / d['workers']:.2g} of their own; --async-momentum keep applies it as "
                "given)", highlight=False, markup=False)
        elif report.kind in ("storage_warning", "mixed_gpus", "optimizer_changed"):
            _warn(str(report.details["warning"]))
        elif report.kind == "checkpoint_failed":
            self.failed_uploads += 1
            step = report.details.get("step")
            _warn(f"the checkpoint of step {step} could not be stored ({report.details.get('error')}); training "
                  "goes on, the previous checkpoints stay valid" if self.failed_uploads == 1 else
                  f"the checkpoint of step {step} could not be stored either ({self.failed_uploads} failed so far)")


def _warn(text: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``cmdare train`` to the main app."""
    app.command("train")(train_command)
