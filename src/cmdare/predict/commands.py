"""``cmdare models ...`` (evaluate, fit) and ``cmdare predict ...`` (single questions and tables)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer

from cmdare.option_values import DEFAULT_BATCH_SIZE

models_app = typer.Typer(help="Fit and evaluate the performance models.", no_args_is_help=True)
predict_app = typer.Typer(help="Predict step time, cluster speed, checkpoint and startup time.", no_args_is_help=True)

_INPUT = typer.Option(None, "--input", help="CSV with CM-DARE column names; one question per row.")
_OUTPUT = typer.Option(None, "--output", help="With --input: where to write its rows plus a 'Predicted ...' column "
                       "(a new file unless --force; default: stdout).")
_FORCE = typer.Option(False, "--force", help="Replace an existing --output file (a symbolic link is replaced, never "
                      "followed).")
_INTERVAL = typer.Option(
    None, "--interval", min=0.01, max=0.99, help="Also print a prediction interval at this level, e.g. 0.9."
)


def register(app: typer.Typer) -> None:
    """Add the ``models`` and ``predict`` command groups."""
    app.add_typer(models_app, name="models")
    app.add_typer(predict_app, name="predict")


@models_app.command("evaluate")
def evaluate_cmd(
    task: list[str] = typer.Option(
        None,
        "--task",
        help="step_time, cluster_speed, checkpoint_remote, checkpoint_local, accuracy, startup (default: all)",
    ),
    plot_dir: Path = typer.Option(None, "--plot-dir", help="Write predicted-vs-measured plots here."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of tables."),
    force: bool = typer.Option(False, "--force", help="Replace existing plots in --plot-dir."),
) -> None:
    """Errors of every model beside the published baselines on the same splits."""
    from rich.console import Console
    from rich.table import Table

    from cmdare.console import console as make_console
    from cmdare.errors import UnknownNameError
    from cmdare.predict.evaluate import TASKS, evaluate, evaluate_startup, plot_cluster_scaling, plot_predictions

    valid = [*TASKS, "startup"]
    for name in task or []:
        if name not in valid:
            raise UnknownNameError("model task", name, valid)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    regression = tuple(t for t in task if t in TASKS) if task else tuple(TASKS)
    with_startup = not task or "startup" in task
    if plot_dir is not None:
        from cmdare.output_files import check_output, output_dir
        from cmdare.predict.evaluate import plot_files

        for path in plot_files(output_dir(plot_dir, "--plot-dir"), regression):
            check_output(path, "--plot-dir", force)  # before minutes of evaluation, not after
    progress = Progress(TextColumn("evaluating {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    with progress:  # on stderr, gone when done: the tables (or the JSON) stay clean
        bar = progress.add_task("", total=len(regression) + with_startup)

        def started(name: str) -> None:
            progress.update(bar, description=name, completed=[*regression, "startup"].index(name))

        frame, preds = evaluate(regression, on_task=started) if regression else (pd_frame(), {})
        if with_startup:
            started("startup")
        startup = evaluate_startup() if with_startup else None
    if as_json:
        out = frame.to_dict(orient="records")
        if startup is not None:
            out += [{"task": "startup", **r} for r in startup.to_dict(orient="records")]
        typer.echo(json.dumps(out))
    else:
        console = make_console()
        for name in pd_unique(frame["task"]):
            part = frame[frame["task"] == name]
            t = TASKS[name]
            table = Table(title=f"{name}: MAPE % (MAE {t.unit} / max error %), n = test predictions")
            table.add_column("protocol")
            table.add_column("subset")
            model_names = list(dict.fromkeys(part["model"]))
            for m in model_names:
                table.add_column(m, justify="right")
            for (protocol, subset), grp in part.groupby(["protocol", "subset"], sort=False):
                cells = []
                for m in model_names:
                    r = grp[grp["model"] == m]
                    cells.append(
                        "-"
                        if r.empty
                        else f"{r.mape.iloc[0]:.2f} ({r.mae.iloc[0]:.3g} / {r.max_ape.iloc[0]:.1f}) n={r.n.iloc[0]}"
                    )
                table.add_row(protocol, subset, *cells)
            console.print(table)
            if name == "accuracy":
                pts = ", ".join(f"{m} {100 * grp.mae.iloc[0]:.2f}" for m, grp in part.groupby("model", sort=False))
                console.print(f"accuracy, leave one published point out: MAE in percentage points: {pts}")
        if startup is not None:
            table = Table(title="startup: mean total seconds (provisioning + staging + booting)")
            for col in ("GPU", "region", "transient", "n", "measured", "model", "group held out", "APE %"):
                table.add_column(col)
            for r in startup.itertuples():
                table.add_row(
                    r.gpu,
                    r.region,
                    str(r.transient),
                    str(r.n),
                    f"{r.measured_total_s:.1f}",
                    f"{r.model_total_s:.1f}",
                    f"{r.held_out_total_s:.1f}",
                    f"{r.held_out_ape:.1f}",
                )
            console.print(table)
            console.print(f"startup, group held out: mean APE {startup.held_out_ape.mean():.2f}%")
    if plot_dir is not None:
        paths = plot_predictions(preds, plot_dir, force)
        if "cluster_speed" in regression:
            paths.append(plot_cluster_scaling(plot_dir, force))
        for path in paths:
            typer.echo(f"wrote {path}", err=as_json)


def pd_frame():
    """An empty DataFrame with the columns of :func:`cmdare.predict.evaluate.evaluate`."""
    import pandas as pd

    return pd.DataFrame(columns=["task", "model", "protocol", "subset", "mae", "mape", "max_ape", "n"])


def pd_unique(values) -> list:
    """Unique values in order of appearance."""
    return list(dict.fromkeys(values))


@models_app.command("fit")
def fit_cmd(
    what: str = typer.Argument(None, metavar="[lifetimes]",
                               help="'lifetimes': fit spot-server lifetimes from --trace files for --offering "
                                    "(default: the performance models)."),
    trace: list[Path] = typer.Option(None, "--trace", help="A preemption trace (repeat for several): Bamboo/Parcae "
                                     "events, GCP counts, cmdare's time_s,server,event CSV or Can't Be Late JSON."),
    offering: str = typer.Option(None, "--offering", help="What the traces measured: CLOUD:GPU[:REGION], e.g. "
                                 "aws:v100 or gcp:a100:us-east1; plan, simulate and lifetime=auto then use the fit."),
    order: str = typer.Option("fifo", "--order", help="Count traces: which servers a drop ends (fifo: the oldest)."),
    from_store: bool = typer.Option(
        False,
        "--from-store",
        help="Also use cmdare's own checkpoints, server startups and training runs recorded in the store.",
    ),
    db: str = typer.Option(None, "--db", help="Store URL (default: CMDARE_DB_URL or the local SQLite file)."),
) -> None:
    """Refit all models on the shared data (and the store) and cache them under the models directory;
    ``fit lifetimes``: fit spot lifetimes from preemption traces."""
    if what == "lifetimes":
        _fit_lifetimes(trace or [], offering, order)
        return
    if what is not None or trace or offering:
        from cmdare.errors import UserInputError

        raise UserInputError(f"'cmdare models fit' takes no argument or 'lifetimes' (with --trace and --offering), "
                             f"got {what!r}" if what is not None else "--trace and --offering go with 'models fit "
                             "lifetimes'")
    import shutil

    import cmdare.predict as P

    shutil.rmtree(P._cache_dir(), ignore_errors=True)
    from cmdare.predict.intervals import calibration_pools
    from cmdare.predict.refine import load_refinement

    for fn in (P.step_time_model, P.cluster_speed_model, P.checkpoint_model, P.startup_model, load_refinement,
               calibration_pools):
        fn.cache_clear()
    P.step_time_model()
    P.cluster_speed_model()
    P.checkpoint_model(False)
    P.checkpoint_model(True)
    P.startup_model()
    if from_store:
        used = P.fit_from_store(db)
        for line in _store_use_lines(used):
            typer.echo(line)
        for gpu, e in used["speed"]["gpus"].items():
            if e["heldout_mape_refined"] is None:
                typer.echo(f"speed {gpu}: {e['runs']} run, correction fitted (held-out error needs 2 runs)")
            else:
                typer.echo(
                    f"speed {gpu}: {e['runs']} runs, held-out MAPE {e['heldout_mape_prior']:.1f}% (public-data prior)"
                    f" -> {e['heldout_mape_refined']:.1f}% (refined)"
                )
    typer.echo(f"fitted models cached in {P._cache_dir()}")


def _store_use_lines(used: dict) -> list[str]:
    """What ``models fit --from-store`` took from the store and what it left out, and why."""
    runs, servers = used["skipped"]["runs"], used["skipped"]["servers"]
    n_runs = sum(len(ids) for ids in runs.values())
    lines = [f"added {used['checkpoints']} checkpoints, {used['servers']} servers and {used['runs']} runs from the "
             f"store; skipped {n_runs} runs and {sum(servers.values())} servers"]
    for reason, ids in runs.items():
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        lines.append(f"  skipped {len(ids)} run(s) ({shown}): {reason}")
    lines += [f"  skipped {n} server(s): {reason}" for reason, n in servers.items()]
    lines += [f"  speed {gpu}: {why}" for gpu, why in used["speed"].get("failed", {}).items()]
    return lines


def _fit_lifetimes(traces: list[Path], offering: str | None, order: str) -> None:
    import datetime

    from cmdare.measure.spot_fits import fit_offering, save_fit

    result = fit_offering(traces, _need_option(offering, "--offering"), datetime.date.today().isoformat(), order)
    path = save_fit(result)
    loglik = ", ".join(f"{k} {v:.3f}" for k, v in result.heldout_loglik.items())
    mean_h = result.server_hours / result.n_preemptions
    typer.echo(f"{result.meta['offering']}: {result.n_servers} servers, {result.n_preemptions} preemptions in "
               f"{result.server_hours:.1f} server-hours; mean lifetime {mean_h:.2f} h")
    typer.echo(f"chosen: {result.chosen} {result.model.params()} (held-out log-likelihood per preemption: {loglik})")
    typer.echo(f"saved to {path}: plan, plan simulate and --revocations lifetime=auto use it for this offering")


def _need_option(value: str | None, flag: str) -> str:
    from cmdare.errors import UserInputError

    if value is None:
        raise UserInputError(f"give {flag}")
    return value


def _table(kind: str, input_path: Path | None, output_path: Path | None, remote: bool = False,
           force: bool = False) -> None:
    from cmdare.errors import UserInputError
    from cmdare.output_files import check_output, one_line
    from cmdare.predict.tables import predict_table, read_table, write_table

    if input_path is None:
        raise UserInputError("--output writes the answers to an --input table: give --input F.csv (one question "
                             "per row), or leave --output out to print one answer")
    if output_path is not None:
        check_output(output_path, "--output", force)
    out = predict_table(read_table(input_path), kind, remote=remote)
    if output_path is None:
        typer.echo(out.to_csv(index=False), nl=False)
    else:
        write_table(out, output_path, force)
        typer.echo(f"wrote {len(out)} rows to {one_line(output_path)}")


def _model(name: str | None, input_shape: str | None = None):
    """``--model``'s features (at ``--input-shape`` for your own model); a model CM-DARE did not measure gets a
    note on stderr: its prediction extrapolates."""
    from cmdare.predict.workloads import workload_features
    from cmdare.workloads.commands import parse_shape

    w = workload_features(_need(name, "--model"), parse_shape(input_shape) if input_shape else None)
    if not w.measured:
        at = f" at input {input_shape}" if input_shape else ""
        typer.echo(f"note: {w.name} was not measured by CM-DARE; predicted from its profile{at} "
                   f"({w.model_flops / 1e9:.4g} GFLOPs per sample trained, {w.num_params:,} parameters): this "
                   "extrapolates from the public data", err=True)
    return w


_INPUT_SHAPE = typer.Option(None, "--input-shape", help="Your own model (an import path): one sample's shape, e.g. "
                            "32 for a vector of 32 (default: 3,32,32, CIFAR's images).")
_BATCH_SIZE = typer.Option(None, "--batch-size", help="Per-worker batch size (default: cmdare train's, "
                           f"{DEFAULT_BATCH_SIZE}; CM-DARE measured at 128).")


def _no_batch_with_table(batch_size: int | None) -> None:
    if batch_size is not None:
        from cmdare.errors import UserInputError

        raise UserInputError("--batch-size does not apply to an --input table: its Model FLOPs are the data's, "
                             "per sample at CM-DARE's batch of 128")


def _need(value, flag: str):
    from cmdare.errors import UserInputError

    if value is None:
        raise UserInputError(f"give {flag} (or --input FILE.csv)")
    return value


@predict_app.command("step-time")
def step_time_cmd(
    model: str = typer.Option(
        None, "--model", help="A model of `cmdare workloads`, e.g. t2t_resnet32 (measured by CM-DARE) or resnet32."
    ),
    gpu: str = typer.Option(None, "--gpu", help="GPU type (k80, p100, v100, t4, l4, a100, h100) or its TFLOPS."),
    latency_ms: float = typer.Option(0.3, "--latency-ms", min=0.0, help="Worker-PS network latency."),
    input_shape: str = _INPUT_SHAPE,
    batch_size: int = _BATCH_SIZE,
    input_path: Path = _INPUT,
    output_path: Path = _OUTPUT,
    level: float = _INTERVAL,
    force: bool = _FORCE,
) -> None:
    """Seconds per training step on one GPU."""
    if input_path is not None or output_path is not None:
        _no_batch_with_table(batch_size)
        return _table("step-time", input_path, output_path, force=force)
    from cmdare.option_values import check_number
    from cmdare.predict import gpu_tflops, predict_step_time_s
    from cmdare.predict.features import LIMITS

    g = _need(gpu, "--gpu")
    with contextlib.suppress(ValueError):
        g = float(g)
    if isinstance(g, float):
        check_number(g, "--gpu", 0.001, LIMITS["GPU TFLOPS"], "TFLOPS")
    check_number(latency_ms, "--latency-ms", 0.0, LIMITS["Latency (ms)"], "ms")
    t = predict_step_time_s(_model(model, input_shape), g, latency_ms, batch_size=batch_size)
    if level is None:
        typer.echo(f"{t:.4f} s/step")
        return
    from cmdare.predict.intervals import POOL_WORDS, format_interval, interval, step_pool

    pool = step_pool(float(g) if isinstance(g, float) else gpu_tflops(g))
    typer.echo(format_interval(t, *interval(t, pool, level), "s/step", level) + f" (calibrated on {POOL_WORDS[pool]})")


@predict_app.command("cluster-speed")
def cluster_speed_cmd(
    model: str = typer.Option(None, "--model", help="A model of `cmdare workloads`, e.g. t2t_resnet15."),
    workers: str = typer.Option(None, "--workers", help="GPU workers: a mix such as v100:4 or k80:2,p100:1, or a "
                                "count of T4s (the default GPU, named on stderr), e.g. 4."),
    ps: int = typer.Option(1, "--ps", min=1, help="Number of parameter servers."),
    placement: str = typer.Option(
        "round-robin", "--placement", help="Tensor placement on the PS: round-robin, greedy, mxnet, byteps, psld."
    ),
    input_shape: str = _INPUT_SHAPE,
    batch_size: int = _BATCH_SIZE,
    input_path: Path = _INPUT,
    output_path: Path = _OUTPUT,
    level: float = _INTERVAL,
    force: bool = _FORCE,
) -> None:
    """Global steps per second of asynchronous PS training."""
    if input_path is not None or output_path is not None:
        _no_batch_with_table(batch_size)
        return _table("cluster-speed", input_path, output_path, force=force)
    from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, default_gpu_note, parse_workers
    from cmdare.predict import predict_cluster_steps_per_s

    asked = parse_workers(_need(workers, "--workers"))
    speed = predict_cluster_steps_per_s(_model(model, input_shape), asked.counts(DEFAULT_WORKER_GPU), ps,
                                        placement=placement, batch_size=batch_size)
    if asked.mix is None:
        typer.echo(f"note: {default_gpu_note(asked.total, DEFAULT_WORKER_GPU)}", err=True)
    if level is None:
        typer.echo(f"{speed:.3f} steps/s")
        return
    from cmdare.predict.intervals import format_interval, interval

    typer.echo(format_interval(speed, *interval(speed, "cluster", level), "steps/s", level))


@predict_app.command("checkpoint")
def checkpoint_cmd(
    size_mb: float = typer.Option(None, "--size-mb", min=0.0, help="Checkpoint size in MB."),
    tensors: int = typer.Option(None, "--tensors", min=1, help="Number of tensors (variables), if known."),
    remote: bool = typer.Option(False, "--remote/--local", help="Save and upload to a bucket, or save locally."),
    input_path: Path = _INPUT,
    output_path: Path = _OUTPUT,
    level: float = _INTERVAL,
    force: bool = _FORCE,
) -> None:
    """Seconds to write a checkpoint (and upload it with --remote)."""
    if input_path is not None or output_path is not None:
        return _table("checkpoint", input_path, output_path, remote=remote, force=force)
    from cmdare.option_values import check_number
    from cmdare.predict import predict_checkpoint_s
    from cmdare.predict.features import LIMITS

    size = check_number(_need(size_mb, "--size-mb"), "--size-mb", 0.0, LIMITS["Checkpoint Size (MB)"], "MB")
    if tensors is not None:
        check_number(tensors, "--tensors", 1, LIMITS["Number of Tensors"])
    secs = predict_checkpoint_s(size * 1e6, tensors, remote)
    if level is None:
        typer.echo(f"{secs:.3f} s")
        return
    from cmdare.predict.intervals import format_interval, interval

    pool = "checkpoint_remote" if remote else "checkpoint_local"
    typer.echo(format_interval(secs, *interval(secs, pool, level), "s", level))


@predict_app.command("startup")
def startup_cmd(
    gpu: str = typer.Option(..., "--gpu", help="GPU type (k80, p100; others use the pooled fit)."),
    transient: bool = typer.Option(False, "--transient/--on-demand", help="Preemptible/spot or on-demand."),
    region: str = typer.Option(None, "--region", help="east or west (default: pooled over regions)."),
    samples: int = typer.Option(0, "--samples", min=0, help="Also draw this many samples and print quantiles."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Expected seconds per server startup phase."""
    import numpy as np

    from cmdare.predict import gpu_tflops, startup_model

    gpu_tflops(gpu)  # unknown GPU names fail here with the list of valid ones
    model = startup_model()
    mean = model.mean_s(gpu, transient, region)
    typer.echo(" ".join(f"{k}={v:.1f}s" for k, v in mean.items()) + f" total={sum(mean.values()):.1f}s")
    if samples:
        rng = np.random.default_rng(seed)
        totals = np.array([sum(model.sample(rng, gpu, transient, region).values()) for _ in range(samples)])
        q = np.percentile(totals, [5, 50, 95])
        typer.echo(f"total over {samples} samples: p5={q[0]:.1f}s p50={q[1]:.1f}s p95={q[2]:.1f}s")


@predict_app.command("workloads")
def workloads_cmd() -> None:
    """List the published workloads the models were trained on, with their features."""
    from cmdare.predict import list_published_workloads, published_workload

    for name in list_published_workloads():
        w = published_workload(name)
        typer.echo(
            f"{w.name:<11} {w.display_name:<16} FLOPs={w.model_flops:.3e} params={w.num_params:>9} "
            f"tensors={w.num_tensors:>3} checkpoint={w.checkpoint_mb} MB"
        )


@predict_app.command("accuracy")
def accuracy_cmd(
    workers: int = typer.Option(..., "--workers", min=1, help="Asynchronous workers at the start."),
    steps: int = typer.Option(64000, "--steps", min=1, help="Global training steps."),
    batch_size: int = typer.Option(128, "--batch-size", min=1, help="Per-worker batch size."),
    staleness: float = typer.Option(None, "--staleness", min=0.0, help="Mean push staleness (default: workers-1)."),
    revocations: int = typer.Option(0, "--revocations", min=0, help="Membership changes during the run."),
    lr_policy: str = typer.Option("unchanged", "--lr-policy", help="unchanged, linear, sqrt or staleness."),
    curve: bool = typer.Option(False, "--curve", help="Also print the accuracy at 1/8, 1/4, 1/2 of the steps."),
) -> None:
    """Final test accuracy of ResNet-32 on CIFAR-10 (fitted on the published ICAC 2019 points)."""
    import numpy as np

    from cmdare.predict.accuracy import accuracy_model, policy_code

    row = [workers, np.nan if staleness is None else staleness, batch_size, steps, policy_code(lr_policy), revocations]
    model = accuracy_model()
    typer.echo(f"{model.predict([row])[0]:.2%} final test accuracy")
    if curve:
        grid = [steps / 8, steps / 4, steps / 2, steps]
        acc = model.predict_curve(row, grid)
        typer.echo(" ".join(f"step {g:.0f}: {a:.2%}" for g, a in zip(grid, acc, strict=True)))
