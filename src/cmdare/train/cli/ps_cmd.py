"""``cmdare ps add|remove RUN``: change the parameter shards of a running run (a request its driver carries out)."""

from __future__ import annotations

import typer
from rich.console import Console

console = Console(soft_wrap=True)

ps_app = typer.Typer(help="Change the parameter shards of a running training run.", no_args_is_help=True)


_STORAGE_OPTION = typer.Option(None, envvar="CMDARE_STORAGE", help="The run's storage (as given to train).")


@ps_app.command("add")
def ps_add(run: str = typer.Argument(..., help="Run id (see the train summary)."),
           storage: str = _STORAGE_OPTION) -> None:
    """Add one parameter shard to a running run; the coordinator fills it by migrating blocks."""
    from cmdare.storage import run_storage
    from cmdare.train.cli.runs_cmd import recorded_storage
    from cmdare.train.runtime.run_files import request_change

    request_change(run_storage(run, storage or recorded_storage(run)), "add")
    console.print(f"requested: add a shard to {run}")


@ps_app.command("remove")
def ps_remove(run: str = typer.Argument(..., help="Run id."),
              shard: int = typer.Option(None, help="Shard index to remove (default: the last)."),
              storage: str = _STORAGE_OPTION) -> None:
    """Drain one parameter shard of a running run onto the others and stop it."""
    from cmdare.storage import run_storage
    from cmdare.train.cli.runs_cmd import recorded_storage
    from cmdare.train.runtime.run_files import request_change

    request_change(run_storage(run, storage or recorded_storage(run)), "remove", shard)
    console.print(f"requested: remove shard {'last' if shard is None else shard} of {run}")


def register(app: typer.Typer) -> None:
    """Add ``cmdare ps`` to the main app."""
    app.add_typer(ps_app, name="ps")
