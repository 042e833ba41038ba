"""``cmdare models ...``: evaluate the performance models against the published baselines, and fit them (on the
public data, your own runs in the store, or preemption traces)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

models_app = typer.Typer(help="Fit and evaluate the performance models.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``models`` command group."""
    app.add_typer(models_app, name="models")


@models_app.command("evaluate")
def evaluate_cmd(
    task: list[str] = typer.Option(
        None,
        "--task",
        help="step_time, cluster_speed, checkpoint_remote, checkpoint_local, accuracy, startup, generations "
             "(default: all)",
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

    valid = [*TASKS, "startup", "generations"]
    for name in task or []:
        if name not in valid:
            raise UnknownNameError("model task", name, valid)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    regression = tuple(t for t in task if t in TASKS) if task else tuple(TASKS)
    with_startup = not task or "startup" in task
    with_generations = not task or "generations" in task
    if plot_dir is not None:
        from cmdare.output_files import check_output, output_dir
        from cmdare.predict.evaluate import plot_files

        for path in plot_files(output_dir(plot_dir, "--plot-dir"), regression):
            check_output(path, "--plot-dir", force)  # before minutes of evaluation, not after
    progress = Progress(TextColumn("evaluating {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    with progress:  # on stderr, gone when done: the tables (or the JSON) stay clean
        bar = progress.add_task("", total=len(regression) + with_startup + with_generations)

        def started(name: str) -> None:
            progress.update(bar, description=name, completed=[*regression, "startup", "generations"].index(name))

        frame, preds = evaluate(regression, on_task=started) if regression else (pd_frame(), {})
        if with_startup:
            started("startup")
        startup = evaluate_startup() if with_startup else None
        if with_generations:
            started("generations")
        generations = _generation_checks() if with_generations else None
    if as_json:
        out = frame.to_dict(orient="records")
        if startup is not None:
            out += [{"task": "startup", **r} for r in startup.to_dict(orient="records")]
        if generations is not None:
            for check, part in generations.items():
                out += [{"task": "generations", "check": check, **r} for r in part.to_dict(orient="records")]
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
        if generations is not None:
            _print_generations(console, generations)
    if plot_dir is not None:
        paths = plot_predictions(preds, plot_dir, force)
        if "cluster_speed" in regression:
            paths.append(plot_cluster_scaling(plot_dir, force))
        for path in paths:
            typer.echo(f"wrote {path}", err=as_json)


def _generation_checks() -> dict:
    """The cross-generation step-time model's errors, its held-out V100 check and the 2-PS cluster check."""
    from cmdare.predict.generation_eval import generation_errors, held_out_v100
    from cmdare.predict.two_ps_check import two_ps_errors

    return {"errors": generation_errors(), "held_out_v100": held_out_v100(), "two_ps": two_ps_errors()}


def _print_generations(console, checks: dict) -> None:
    from rich.table import Table

    table = Table(title="generations: cross-generation step time, MAPE % (max %), n")
    for col in ("protocol", "held out", "dataset", "MAPE (max) n"):
        table.add_column(col)
    for r in checks["errors"].itertuples():
        table.add_row(r.protocol, r.held_out, r.dataset, f"{r.mape:.2f} ({r.max_ape:.1f}) n={r.n}")
    console.print(table)
    v100 = checks["held_out_v100"]
    per = ", ".join(f"{r.cnn} {r.error_pct:+.1f}" for r in v100.itertuples())
    console.print(f"CM-DARE networks on V100, held out: MAPE {v100.error_pct.abs().mean():.2f}% ({per})")
    two = checks["two_ps"]
    console.print(f"P100 with 2 PS, fitted on 1 PS: MAPE {two.error_measured_step_pct.abs().mean():.2f}% from the "
                  f"measured single-GPU step time, {two.error_predicted_step_pct.abs().mean():.2f}% from the "
                  f"predicted one (n={len(two)})")


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
