"""CLI of the cloud concern: ``cmdare cluster-config``."""

from __future__ import annotations

import os
from pathlib import Path

import typer

FORMATS = ("table", "json")
_DEFAULT_WORKERS = 4

_CATALOG_HELP = "Catalog override file (YAML/JSON) merged over the defaults; default $CMDARE_CATALOG."


def cluster_config_command(
    cloud: str = typer.Option(..., "--cloud", help="gcp, aws, or local (Ray's fake multi-node provider here)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type when --workers is a number, e.g. v100, t4 "
                                   "(default: T4, the default GPU of every cloud)."),
    workers: str | None = typer.Option(None, "--workers",
                                       help="Training workers (one per GPU): a number of --gpu, or a mix like "
                                            "k80:2,v100:1 (default: 4)."),
    ps: int = typer.Option(1, "--ps", help="Parameter-server nodes (on-demand, CPU only); 0 for an "
                               "all-reduce run (cmdare train --topology allreduce)."),
    transient: bool = typer.Option(False, "--transient/--on-demand",
                                   help="Preemptible (GCP) / Spot (AWS) GPU workers; a cloud needs --storage then."),
    storage: str | None = typer.Option(None, "--storage",
                                       help="Checkpoint storage of every node (CMDARE_STORAGE): s3://... or gs://... "
                                            "(local: also a directory)."),
    force: bool = typer.Option(False, "--force", help="Accept --transient without --storage (checkpoints at risk); "
                                                      "replace an existing --output file (a symbolic link is "
                                                      "replaced, never followed)."),
    wheel: Path | None = typer.Option(None, "--wheel",
                                      help="cmdare wheel to install on every node (default: the newest "
                                           "dist/cmdare-VERSION-*.whl here: pip wheel --no-deps -w dist .)."),
    cmdare_spec: str | None = typer.Option(None, "--cmdare-spec",
                                           help="Instead of a wheel: the pip spec the nodes install cmdare from "
                                                "(cmdare==X from your index, git+https://..., a URL)."),
    region: str | None = typer.Option(None, "--region", help="Cloud region (default us-central1 / us-east-1)."),
    zone: str | None = typer.Option(None, "--zone", help="Zone (GCP: default the first zone offering every GPU type)."),
    output: Path | None = typer.Option(None, "--output", "-o",
                                       help="Write the YAML here, a new file unless --force (default: stdout)."),
    project_id: str | None = typer.Option(None, "--project-id", help="GCP project id."),
    cluster_name: str | None = typer.Option(None, "--cluster-name", help="Ray cluster name."),
    image: str | None = typer.Option(None, "--image",
                                     help="Boot image of the GPU nodes (GCP image, AWS AMI id) instead of the per-GPU "
                                          "default."),
    cpus_per_node: int | None = typer.Option(None, "--cpus-per-node", help="local: CPUs of each node (default 1)."),
    spare_nodes: int | None = typer.Option(None, "--spare-nodes",
                                           help="local: nodes per type beyond its minimum, for replacements "
                                                "(default 1)."),
    head_port: int | None = typer.Option(None, "--head-port", help="local: the head's GCS port (default 6379)."),
    catalog_file: str | None = typer.Option(None, "--catalog", help=_CATALOG_HELP),
) -> None:
    """Write a Ray cluster-launcher YAML: on-demand head and PS nodes, (transient) GPU workers per GPU type."""
    from cmdare.cloud.catalog import load_catalog
    from cmdare.cloud.launcher import cluster_config, render_yaml
    from cmdare.cloud.launcher_local import is_local_config
    from cmdare.cloud.launcher_names import GPU_LABEL
    from cmdare.cloud.launcher_setup import RAY_TOKEN_COMMAND, RAY_TOKEN_PATH

    def warn(message: str) -> None:
        typer.echo(f"warning: {message}", err=True)

    from cmdare.output_files import check_output, one_line, write_output

    if output is not None:
        output = check_output(output, "--output", force)  # before a wheel is looked for or packed
    catalog = load_catalog(catalog_file)
    config_path = str(output.absolute()) if output is not None else None
    config = cluster_config(catalog, cloud, gpu, workers=workers if workers is not None else _DEFAULT_WORKERS, ps=ps,
                            transient=transient, region=region, zone=zone, cluster_name=cluster_name,
                            project_id=project_id, cmdare_spec=cmdare_spec, image=image, wheel=wheel,
                            storage=storage, force=force, cpus_per_node=cpus_per_node,
                            spare_nodes=spare_nodes, head_port=head_port, config_path=config_path, warn=warn)
    _note_default_gpu(catalog, cloud, gpu, workers)
    text = render_yaml(config, catalog, transient)
    provider = config["provider"]
    local = is_local_config(config)
    for node in config["available_node_types"].values() if not local else ():
        gpu_name = node.get("labels", {}).get(GPU_LABEL)
        if gpu_name is not None:
            off = catalog.offering(gpu_name, provider["type"], provider["region"], role="worker")
            if off.retired:
                typer.echo(f"note: {off.gpu} on {off.cloud}: {off.note or 'retired by the cloud'}", err=True)
    if not Path(RAY_TOKEN_PATH).expanduser().is_file() and not (local and os.environ.get("RAY_AUTH_TOKEN")):
        typer.echo(f"note: no Ray token at {RAY_TOKEN_PATH}: create one with `{RAY_TOKEN_COMMAND}` before "
                   + ("starting the cluster" if local else "`ray up` (file_mounts copies it to every node)"), err=True)
    if output is None:
        typer.echo(text, nl=False)
        return
    write_output(output, text, "--output", force)
    typer.echo(f"wrote {one_line(output)}", err=True)


def _note_default_gpu(catalog, cloud: str, gpu: str | None, workers: str | None) -> None:
    """Name the GPU type a bare count of workers (typed or the default) stands for, on stderr."""
    from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, default_gpu_note, parse_workers

    if gpu is not None:
        return
    parsed = parse_workers(workers if workers is not None else _DEFAULT_WORKERS, catalog)
    if parsed.mix is None:
        note = default_gpu_note(parsed.total, catalog.gpu(DEFAULT_WORKER_GPU).name, cloud.strip().lower(),
                                typed=workers is not None)
        typer.echo(f"note: {note}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``cluster-config`` to the main app (``catalog`` is :mod:`cmdare.plan.catalog_command`'s: it shows each
    offering's lifetime model, which the lifetime fits above this layer decide)."""
    app.command("cluster-config")(cluster_config_command)
