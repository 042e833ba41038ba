"""``cmdare workloads``: the model zoo with its profiler figures, as a table or JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cmdare.errors import UserInputError

_FORMATS = ("table", "json")


def parse_shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: ``3,32,32`` or ``3x32x32`` (an image's C,H,W), or any sample's shape (``32``) for
    your own model (the profiler checks it against the model)."""
    parts = [p.strip() for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UserInputError(f"--input-shape must look like 3,32,32 (or 32 for a vector), got {text!r}") from None
    if not shape:
        raise UserInputError(f"--input-shape must give at least one size, got {text!r}")
    return shape


def workloads(
    input_shape: Annotated[str, typer.Option("--input-shape", help="C,H,W of one image; for your own model "
                                             "(an import path) any sample's shape, e.g. 32.")] = "3,32,32",
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    models: Annotated[list[str] | None, typer.Option("--model", "-m", help="Only these models (repeatable).")] = None,
    num_classes: Annotated[int, typer.Option("--num-classes", help="Classifier outputs.")] = 10,
) -> None:
    """List the CNN zoo with FLOPs, parameters, tensor sizes and checkpoint bytes per model."""
    from cmdare.workloads.families import MEASURED_AS
    from cmdare.workloads.profile import profile_model
    from cmdare.workloads.registry import describe_model, model_names

    if fmt not in _FORMATS:
        raise UserInputError(f"--format must be one of {', '.join(_FORMATS)}, got {fmt!r}")
    shape = parse_shape(input_shape)
    from rich.console import Console
    from rich.progress import track

    from cmdare.console import console as make_console

    names = list(models) if models else model_names()
    # the first call profiles every network (seconds; kept on disk after): show it on a terminal
    shown = track(names, description="profiling the zoo (once; kept for later calls)", transient=True,
                  console=Console(stderr=True), disable=len(names) < 3)
    profiles = [profile_model(name, shape, num_classes) for name in shown]  # raises on unknown names
    if fmt == "json":
        rows = [dict(p.to_dict(), description=describe_model(p.name), measured_as=MEASURED_AS.get(p.name))
                for p in profiles]
        typer.echo(json.dumps(rows, indent=2))
        return

    from rich.table import Table

    table = Table(
        title=f"cmdare workloads at input {'x'.join(map(str, shape))} "
        "(train FLOPs = 3 x forward; MB = MiB of parameter tensors; measured: its name in the CM-DARE data, "
        "whose measurements plan and predict use; the others are predicted from their profile)",
    )
    for col in (
        "model",
        "GFLOPs/sample fwd",
        "GFLOPs/sample train",
        "params",
        "tensors",
        "avg tensor MB",
        "max tensor MB",
        "checkpoint MB",
        "measured",
        "description",
    ):
        table.add_column(col, justify="left" if col in ("model", "description") else "right")
    for p in profiles:
        table.add_row(
            p.name,
            f"{p.flops_per_sample_forward / 1e9:.3f}",
            f"{p.flops_per_sample_train / 1e9:.3f}",
            f"{p.num_params:,}",
            str(p.num_tensors),
            f"{p.avg_tensor_mb:.4f}",
            f"{p.max_tensor_mb:.4f}",
            f"{p.checkpoint_bytes / 2**20:.2f}",
            MEASURED_AS.get(p.name, "-"),
            describe_model(p.name),
        )
    make_console().print(table)  # piped: no width limit, nothing squeezed into Rich's default 80 columns


def register(app: typer.Typer) -> None:
    """Add ``cmdare workloads`` to the main app."""
    app.command("workloads")(workloads)
