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
from rich.text import Text

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
    "cmdare.predict.models_commands",
    "cmdare.predict.commands",
    "cmdare.train.cli.train_cmd",
    "cmdare.train.cli.ps_cmd",
    "cmdare.run_simulation",  # train --simulate and report run --against-plan (after their commands)
    "cmdare.train.cli.runs_cmd",
    "cmdare.train.cli.export_cmd",
    "cmdare.cloud.commands",
    "cmdare.plan.commands",
    "cmdare.workloads.commands",
    "cmdare.measure.commands",
)



def _show_version(value: bool) -> None:
    if value:
        from cmdare import __version__

        print(f"cmdare {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                       help="Print cmdare's version and exit.")) -> None:
    """Train on transient cloud GPU servers: measure, predict, plan."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """``error: MESSAGE`` on stderr, one line; the message is plain text (a ``[s3]`` in it stays)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", " ".join(str(message).split())))


def main() -> None:
    """Entry point: run the Typer app, turning cmdare errors into one-line messages. ``kill -USR1 PID`` prints
    every thread's stack on stderr (what a run that seems stuck is waiting for) and the command goes on."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # no real stderr (an in-process runner)
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        status = app(standalone_mode=False)
    except CmdareError as err:
        print_error(str(err))
        sys.exit(getattr(err, "exit_code", 1))
    except typer.TyperException as err:  # a usage error (a missing or unknown option): one line, exit 2
        ctx = getattr(err, "ctx", None)
        command = f"{ctx.command_path} --help" if ctx is not None else "cmdare --help"
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        if message.strip():
            print_error(f"{message} (see '{command}')")
        elif hasattr(err, "show"):  # a command group run without its command: its help
            err.show()
        sys.exit(getattr(err, "exit_code", 2))
    except (KeyboardInterrupt, typer.Abort):
        err_console.print("interrupted")
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)
