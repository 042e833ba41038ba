"""``cmdare export RUN -o FILE``: a run's trained model as a plain PyTorch ``state_dict``."""

from __future__ import annotations

from pathlib import Path

import typer

from cmdare.train.cli.runs_cmd import DB_OPTION, recorded_storage


def export_cmd(run: str = typer.Argument(..., help="Run id (see `cmdare runs`)."),
               output: Path = typer.Option(..., "--output", "-o", help="The file to write (a new file unless "
                                                                        "--force)."),
               fmt: str = typer.Option("torch", "--format", help="torch (torch.save) or safetensors."),
               step: int | None = typer.Option(None, "--step", help="The checkpoint of this step (default: newest)."),
               storage: str | None = typer.Option(None, envvar="CMDARE_STORAGE",
                                                  help="The run's storage (default: as recorded)."),
               db: str | None = DB_OPTION,
               force: bool = typer.Option(False, "--force", help="Replace an existing --output file (a symbolic "
                                                                 "link is replaced, never followed).")) -> None:
    """Write a run's trained model as a plain PyTorch state_dict (parameters and buffers)."""
    from cmdare.output_files import check_output, one_line
    from cmdare.storage import run_storage
    from cmdare.train.duties.export import export_run

    check_output(output, "--output", force)  # before the run's storage is looked up
    done = export_run(run_storage(run, storage or recorded_storage(run, db)), output, fmt, step, force=force)
    # cmdare writes safetensors itself; reading it back needs the package, which cmdare does not install
    load = ("torch.load(FILE, weights_only=True)" if fmt == "torch" else
            "safetensors.torch.load_file(FILE) (pip install safetensors: cmdare wrote the file without it)")
    typer.echo(f"wrote {done.model} of {run} at step {done.step} to {one_line(done.path)}: {done.tensors} tensors, "
               f"{done.parameters:,} values; load with {load} into the model's load_state_dict")


def register(app: typer.Typer) -> None:
    """Add ``cmdare export`` to the main app."""
    app.command("export")(export_cmd)
