"""The ``cmdare`` command.

Each concern registers its own commands from a ``commands`` module (``register(app)``), so this
file only composes them. Heavy imports (torch, ray) happen inside commands, keeping ``--help`` fast.
Every :class:`~cmdare.errors.CmdareError` becomes a one-line message and exit status 1.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import signal
import sys

import typer
from rich.console import Console

from cmdare.errors import CmdareError

app = typer.Typer(
    name="cmdare",
    help="Train on transient cloud GPU servers: measure, predict, plan.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One module per concern; each defines ``register(app: typer.Typer) -> None``.
COMMAND_MODULES: tuple[str, ...] = (
    "cmdare.predict.commands",
    "cmdare.train.commands",
    "cmdare.cloud.commands",
    "cmdare.plan.commands",
    "cmdare.workloads.commands",
    "cmdare.measure.commands",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)

err_console = Console(stderr=True)


def main() -> None:
    """Entry point: run the Typer app, turning cmdare errors into one-line messages. ``kill -USR1 PID`` prints
    every thread's stack on stderr (what a run that seems stuck is waiting for) and the command goes on."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # no real stderr (an in-process runner)
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        app()
    except CmdareError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
