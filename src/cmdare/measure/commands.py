"""CLI of the measure concern: ``cmdare import ...`` and ``cmdare report ...``.

Every command takes ``--db URL`` (default ``CMDARE_DB_URL`` or the SQLite file in the data
directory). Paths to the public data may be omitted: they default to the copy bundled with cmdare
(or ``CMDARE_SHARED_DATA``, a folder holding ``cmdare/`` and ``lifetimes/``). The reports built on
the public data import it on first use.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from cmdare.errors import UserInputError
from cmdare.public_data import PUBLIC_SOURCES, is_bundled, lifetime_files, public_data_dir

_PUBLIC = "the public data bundled with cmdare (or $CMDARE_SHARED_DATA)"
_DB_HELP = "Store URL (SQLAlchemy); default $CMDARE_DB_URL or a SQLite file in the cmdare data directory."
_FMT_HELP = "Output format: table, csv or json."
_PLOT_HELP = "Also draw the report's figure into this PNG file (.svg, .pdf: that format), a new file unless --force."
_FORCE_OPTION = typer.Option(False, "--force", help="Replace an existing --plot file (a symbolic link is replaced, "
                             "never followed).")
_TABLE_OPTION = typer.Option(None, "--table", help="Only this table of the report (default: every table; CSV "
                             "of several has each under a '# NAME' line).")

import_app = typer.Typer(
    help="Import public or exported measurements into the store (idempotent).", no_args_is_help=True
)
report_app = typer.Typer(help="Characterization reports (a table plus a matplotlib figure).", no_args_is_help=True)


def _print_import(result, as_json: bool, verbose: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    files = result.files
    done = sum(f.status == "imported" for f in files)
    typer.echo(
        f"files: {len(files)} ({done} imported, {sum(f.status == 'already imported' for f in files)} "
        f"already imported, {sum(f.status == 'skipped' for f in files)} skipped); rows read "
        f"{result.read}, imported {result.imported}, skipped {result.skipped}"
    )
    for reason, n in sorted(result.reasons().items(), key=lambda kv: -kv[1]):
        typer.echo(f"  skipped {n}: {reason}")
    if verbose:
        for f in files:
            typer.echo(f"  {f.status:16} {f.read:6} read {f.imported:6} imported  {f.path}")


@import_app.command("cmdare")
def import_cmdare_cmd(
    directory: Path | None = typer.Argument(None, help=f"CM-DARE's processed_data; default cmdare/ of {_PUBLIC}."),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="One line per file."),
) -> None:
    """Import CM-DARE's measurements: speed tables, cluster speed, checkpoints, startup, chief rejoining."""
    from cmdare.measure.importers.cmdare_data import import_cmdare_dir
    from cmdare.measure.store import open_store

    path = directory or public_data_dir() / "cmdare"
    store = open_store(db)
    _print_import(import_cmdare_dir(store, path), as_json, verbose)


@import_app.command("tensorboard")
def import_tensorboard_cmd(
    path: Path = typer.Argument(..., help="A CSV export (Wall time,Step,Value), an event file, or a logdir."),
    run: str = typer.Option(..., "--run", help="Run id the scalars belong to (created if new)."),
    tag: str | None = typer.Option(None, "--tag", help="Tag of a CSV export (default: from its file name)."),
    workers: int | None = typer.Option(None, "--workers", help="Workers of the run: also store cluster speed."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type of the run's workers (with --workers)."),
    ps: int = typer.Option(1, "--ps", help="Parameter servers of the run (with --workers)."),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="One line per file."),
) -> None:
    """Import TensorBoard scalars (global_step/sec, loss, accuracy) of one run."""
    from cmdare.measure.importers.tensorboard_import import import_tensorboard
    from cmdare.measure.store import open_store

    if workers is not None and workers < 1:
        raise UserInputError("--workers must be at least 1")
    store = open_store(db)
    _print_import(import_tensorboard(store, path, run, tag, workers, gpu, ps), as_json, verbose)


@import_app.command("lifetimes")
def import_lifetimes_cmd(
    files: list[Path] | None = typer.Argument(
        None, help=f"Lifetime CSV/JSON files; default the two in lifetimes/ of {_PUBLIC}."
    ),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="One line per file."),
) -> None:
    """Import server lifetimes: the GCE GPU lifetime sheet, the preemption JSON, or a lifetime_s CSV."""
    from cmdare.measure.importers.lifetimes import import_lifetimes
    from cmdare.measure.store import open_store

    paths = list(files or lifetime_files())
    store = open_store(db)
    _print_import(import_lifetimes(store, paths), as_json, verbose)


@import_app.command("public")
def import_public_cmd(
    data_dir: Path | None = typer.Argument(
        None, help=f"Data root holding cmdare/ and lifetimes/; default {_PUBLIC}."
    ),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Import all the public data: CM-DARE's CSVs and both lifetime files."""
    from cmdare.measure.importers.public import import_public
    from cmdare.measure.store import open_store

    store = open_store(db)
    for result in import_public(store, data_dir):
        _print_import(result, as_json, False)


def _import_on_first_use(store, name: str) -> None:
    from cmdare.measure.importers.public import ensure_public_data

    done = ensure_public_data(store, name)
    if done is not None:  # on stderr: --format csv/json output stays clean
        typer.echo(
            f"the store had no public measurements for this report: imported {done.imported} rows of "
            f"{PUBLIC_SOURCES} from {'the copy bundled with cmdare' if is_bundled() else public_data_dir()} "
            f"into {store.url}",
            err=True,
        )


#: What ``report run --against-plan`` adds: (report, store, run id) -> None, a table of the run's command line
#: simulated. Set by :mod:`cmdare.run_simulation`, which may import the planner (this module may not).
AGAINST_PLAN: Callable[[Any, Any, str], None] | None = None


def _emit(name: str, db: str | None, fmt: str, plot: Path | None, run_id: str | None = None,
          table: str | None = None, force: bool = False, extend: Callable[[Any, Any], None] | None = None):
    from cmdare.measure.reports import FORMATS, build_report
    from cmdare.measure.store import open_store
    from cmdare.output_files import check_figure_output, one_line

    if fmt not in FORMATS:
        from cmdare.errors import UnknownNameError

        raise UnknownNameError("report format", fmt, FORMATS)
    if plot is not None:
        check_figure_output(plot, "--plot", force)  # before the store is opened or the report built
    store = open_store(db)
    if run_id is None:
        _import_on_first_use(store, name)
    report = build_report(name, store, run_id=run_id)
    if extend is not None:
        extend(report, store)
    typer.echo(report.render(fmt, table), nl=False)
    if plot is not None:
        out = report.save_plot(plot, force)
        if fmt == "table":
            typer.echo(f"plot written to {one_line(out)}")
    return report


@report_app.command("lifetimes")
def report_lifetimes(
    fmt: str = typer.Option("table", "--format", help=_FMT_HELP),
    table: str | None = _TABLE_OPTION,
    plot: Path | None = typer.Option(None, "--plot", help=_PLOT_HELP),
    save_models: Path | None = typer.Option(
        None, "--save-models", help="Write fitted models (<model>-<type>.json) into this directory (created if "
                                    "missing; its files replaced only with --force)."
    ),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    force: bool = typer.Option(False, "--force", help="Replace an existing --plot file or --save-models files."),
) -> None:
    """Lifetime CDFs per server type and region, revocation fractions, fitted exponential/bathtub models."""
    from cmdare.output_files import check_output, one_line, output_dir, write_output

    if save_models is not None:
        save_models = output_dir(save_models, "--save-models")
    _emit("lifetimes", db, fmt, plot, table=table, force=force)
    if save_models is not None:
        from cmdare.measure.reports.lifetimes import fit_default_models
        from cmdare.measure.store import open_store

        fitted = fit_default_models(open_store(db).frame("lifetime_observations"))
        files = {save_models / f"{name}-{key}.json": model for name, by_key in fitted.items()
                 for key, model in by_key.items()}
        for path in files:
            check_output(path, "--save-models", force)  # all or none: no file replaced without --force
        for path, model in files.items():
            write_output(path, json.dumps(model), "--save-models", force)
        if fmt == "table":
            typer.echo(f"models written to {one_line(save_models)}")


@report_app.command("scaling")
def report_scaling(
    fmt: str = typer.Option("table", "--format", help=_FMT_HELP),
    table: str | None = _TABLE_OPTION,
    plot: Path | None = typer.Option(None, "--plot", help=_PLOT_HELP),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    force: bool = _FORCE_OPTION,
) -> None:
    """Cluster speed against the number of workers per GPU type and #PS, with the ideal line."""
    _emit("scaling", db, fmt, plot, table=table, force=force)


@report_app.command("startup")
def report_startup(
    fmt: str = typer.Option("table", "--format", help=_FMT_HELP),
    table: str | None = _TABLE_OPTION,
    plot: Path | None = typer.Option(None, "--plot", help=_PLOT_HELP),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    force: bool = _FORCE_OPTION,
) -> None:
    """Startup phases (provisioning, staging, booting, joining) per GPU type, transient vs on-demand."""
    _emit("startup", db, fmt, plot, table=table, force=force)


@report_app.command("checkpoint")
def report_checkpoint(
    fmt: str = typer.Option("table", "--format", help=_FMT_HELP),
    table: str | None = _TABLE_OPTION,
    plot: Path | None = typer.Option(None, "--plot", help=_PLOT_HELP),
    run: str | None = typer.Option(None, "--run", help="Only this run's checkpoints."),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    force: bool = _FORCE_OPTION,
) -> None:
    """Checkpoint duration (local and remote) against checkpoint size."""
    _emit("checkpoint", db, fmt, plot, run, table=table, force=force)


@report_app.command("run")
def report_run(
    run_id: str = typer.Argument(..., help="The run id (e.g. run-20261129-201500-ab12)."),
    fmt: str = typer.Option("table", "--format", help=_FMT_HELP),
    table: str | None = _TABLE_OPTION,
    plot: Path | None = typer.Option(None, "--plot", help=_PLOT_HELP),
    db: str | None = typer.Option(None, "--db", help=_DB_HELP),
    force: bool = _FORCE_OPTION,
    against_plan: bool = typer.Option(False, "--against-plan", help="Beside the run, the simulator's prediction of "
                                      "the same command line (table against_plan: cost, revocations, replacements "
                                      "and, on a joined cluster, time; 100 runs from the run's seed)."),
) -> None:
    """One run: throughput over time with revocations, replacements and checkpoints marked, cost so far."""
    extend = None
    if against_plan:
        if AGAINST_PLAN is None:
            raise RuntimeError("no simulator registered (cmdare.run_simulation)")
        extend = lambda report, store: AGAINST_PLAN(report, store, run_id)  # noqa: E731
    _emit("run", db, fmt, plot, run_id, table=table, force=force, extend=extend)


def register(app: typer.Typer) -> None:
    """Add ``cmdare import`` and ``cmdare report`` to the main app."""
    app.add_typer(import_app, name="import")
    app.add_typer(report_app, name="report")
