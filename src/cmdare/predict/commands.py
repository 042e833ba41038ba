"""``cmdare predict ...``: single questions and tables (``cmdare models ...`` is in :mod:`.models_commands`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from cmdare.option_values import DEFAULT_BATCH_SIZE

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
    """Add the ``predict`` command group."""
    app.add_typer(predict_app, name="predict")


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
_PRECISION = typer.Option("fp32", "--precision", help="fp32 (TF32 convolutions from Ampere on, as PyTorch does by "
                          "default), amp-bf16 or amp-fp16 (mixed precision).")


def _gpu_notes(gpus) -> None:
    """One note on stderr per GPU type the CM-DARE step-time data did not measure: what its prediction rests on."""
    from cmdare.cloud.gpu_specs import gpu_specs
    from cmdare.predict import gpu_tflops
    from cmdare.predict.generations import generation_step_model
    from cmdare.predict.intervals import step_pool

    specs = gpu_specs()
    seen = [name for name in specs if step_pool(gpu_tflops(name)) == "step_seen"]
    for gpu in gpus:
        tflops = float(gpu) if isinstance(gpu, float) else gpu_tflops(gpu)
        if step_pool(tflops) == "step_seen":
            continue
        from cmdare.predict.step_time import spec_for_tflops

        spec = specs.get(gpu.upper()) if isinstance(gpu, str) else spec_for_tflops(tflops)
        name = gpu.upper() if isinstance(gpu, str) else f"a {tflops:g}-TFLOPS GPU" + (
            f" (the catalog's {spec.name})" if spec is not None else "")
        if spec is None:
            typer.echo(f"note: {name} was not measured in the step-time data ({', '.join(seen)} were): predicted from "
                       f"its FP32 TFLOPS and the spec sheets' median bytes per FLOP by the roofline form fitted on "
                       f"{', '.join(seen)}; this extrapolates", err=True)
            continue
        model = generation_step_model()  # fitted once (cached), and only for a GPU it answers
        tf32 = f"TF32 {spec.tf32_tflops:g} TFLOPS for convolutions, " if spec.tf32_tflops != spec.fp32_tflops else ""
        typer.echo(f"note: {name} was not measured in the step-time data ({', '.join(seen)} were): predicted from "
                   f"its spec sheet ({tf32}{spec.fp32_tflops:g} TFLOPS FP32, {spec.memory_bw_gbs:g} GB/s) by the "
                   f"cross-generation model, {model.basis(spec)}"
                   + ("" if name in model.gpus_ else "; this extrapolates"), err=True)


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
    precision: str = _PRECISION,
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
    t = predict_step_time_s(_model(model, input_shape), g, latency_ms, batch_size=batch_size, precision=precision)
    _gpu_notes([g])
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
    ps: int = typer.Option(None, "--ps", min=1, help="Number of parameter servers (default 1)."),
    placement: str = typer.Option(
        None, "--placement", help="Tensor placement on the PS: round-robin (default), greedy, mxnet, byteps, psld."
    ),
    topology: str = typer.Option("ps", "--topology", help="ps (asynchronous, through parameter servers) or "
                                 "allreduce (every worker holds the model; gradients averaged each step)."),
    link_gbps: float = typer.Option(None, "--link-gbps", help="Network per server in Gbit/s (default 10, the "
                                    "network CM-DARE's PS runs are taken to have had)."),
    input_shape: str = _INPUT_SHAPE,
    batch_size: int = _BATCH_SIZE,
    precision: str = _PRECISION,
    input_path: Path = _INPUT,
    output_path: Path = _OUTPUT,
    level: float = _INTERVAL,
    force: bool = _FORCE,
) -> None:
    """Global steps per second of asynchronous PS training (--topology allreduce: of all-reduce training)."""
    from cmdare.option_values import check_topology

    check_topology(topology)
    if topology == "allreduce":
        return _allreduce_speed(model, workers, ps, placement, link_gbps, input_shape, batch_size, precision,
                                input_path or output_path, level)
    ps, placement = ps or 1, placement or "round-robin"
    if input_path is not None or output_path is not None:
        _no_batch_with_table(batch_size)
        return _table("cluster-speed", input_path, output_path, force=force)
    from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, default_gpu_note, parse_workers
    from cmdare.predict import predict_cluster_steps_per_s

    asked = parse_workers(_need(workers, "--workers"))
    speed = predict_cluster_steps_per_s(_model(model, input_shape), asked.counts(DEFAULT_WORKER_GPU), ps,
                                        placement=placement, batch_size=batch_size, precision=precision,
                                        link_gbps=link_gbps)
    if asked.mix is None:
        typer.echo(f"note: {default_gpu_note(asked.total, DEFAULT_WORKER_GPU)}", err=True)
    _gpu_notes(list(asked.counts(DEFAULT_WORKER_GPU)))
    if level is None:
        typer.echo(f"{speed:.3f} steps/s")
        return
    from cmdare.predict.intervals import format_interval, interval

    typer.echo(format_interval(speed, *interval(speed, "cluster", level), "steps/s", level))


def _allreduce_speed(model: str | None, workers: str | None, ps: int | None, placement: str | None,
                     link_gbps: float | None, input_shape: str | None, batch_size: int | None, precision: str,
                     table: Path | None, level: float | None) -> None:
    """``predict cluster-speed --topology allreduce``: group steps/s and batches/s, beside a PS on stderr."""
    from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, default_gpu_note, parse_workers
    from cmdare.errors import UserInputError
    from cmdare.predict.allreduce_speed import (
        DEFAULT_LINK_GBPS,
        MIXED_GPUS_NOTE,
        compare_topologies,
        crossover_link_gbps,
        crossover_words,
    )

    given = [name for name, value in (("--ps", ps), ("--placement", placement), ("--input/--output", table),
                                      ("--interval", level)) if value is not None]
    if given:
        raise UserInputError(f"{', '.join(given)} {'means' if len(given) == 1 else 'mean'} nothing with --topology "
                             "allreduce: it has no parameter server, and the intervals and tables are calibrated on "
                             "PS runs")
    asked = parse_workers(_need(workers, "--workers"))
    counts = asked.counts(DEFAULT_WORKER_GPU)
    features = _model(model, input_shape)
    link = DEFAULT_LINK_GBPS if link_gbps is None else link_gbps
    speeds = compare_topologies(features, counts, 1, link, batch_size=batch_size, precision=precision)
    if asked.mix is None:
        typer.echo(f"note: {default_gpu_note(asked.total, DEFAULT_WORKER_GPU)}", err=True)
    _gpu_notes(list(counts))
    if len(counts) > 1:
        typer.echo(f"note: {MIXED_GPUS_NOTE}", err=True)
    where = crossover_words(*crossover_link_gbps(features, counts, 1, batch_size=batch_size, precision=precision))
    typer.echo(f"note: {speeds.why()}; {where}", err=True)
    typer.echo(f"{speeds.allreduce_steps_per_s:.3f} steps/s of {speeds.members} batches "
               f"({speeds.allreduce_batches_per_s:.1f} batches/s)")


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
