"""``cmdare catalog``: GPU types and server prices per cloud region, with each offering's market and the lifetime
model its transient servers get: fitted from preemption traces (:mod:`cmdare.measure.spot_fits`) or the
catalog's interruption rate, labelled an assumption where no measurement stands behind it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer

from cmdare.errors import UnknownNameError
from cmdare.measure.lifetime_markets import offering_lifetime

__all__ = ["catalog_command"]

FORMATS = ("table", "json")
_CATALOG_HELP = "Catalog override file (YAML/JSON) merged over the defaults; default $CMDARE_CATALOG."


def catalog_command(
    gpu: str | None = typer.Option(None, "--gpu", help="Only this GPU type (e.g. k80); 'cpu' for PS servers."),
    cloud: str | None = typer.Option(None, "--cloud", help="Only this cloud: gcp or aws."),
    region: str | None = typer.Option(None, "--region", help="Only this region."),
    fmt: str = typer.Option("table", "--format", help="Output format: table or json."),
    catalog_file: str | None = typer.Option(None, "--catalog", help=_CATALOG_HELP),
) -> None:
    """List GPU types and server prices per cloud region (on-demand and spot/preemptible)."""
    from cmdare.cloud.catalog import load_catalog

    if fmt not in FORMATS:
        raise UnknownNameError("format", fmt, FORMATS)
    catalog = load_catalog(catalog_file)
    if region is not None and cloud is not None:
        catalog.regions(cloud)  # validates the cloud before filtering
    offerings = catalog.find(gpu=gpu, cloud=cloud, region=region)
    if region is not None and not offerings:
        clouds = [cloud] if cloud else catalog.clouds()
        valid = sorted({r for c in clouds for r in catalog.regions(c)})
        raise UnknownNameError("region", region, valid)
    if fmt == "json":
        gpus = [catalog.gpu(gpu)] if gpu and gpu.lower() not in ("cpu", "none") else list(catalog.gpus.values())
        doc = {
            "gpus": [asdict(g) for g in gpus],
            "offerings": [o.to_dict() | {"worker_on_demand_usd_per_h": o.slot_price_per_hour_usd(False),
                                         "worker_spot_usd_per_h": o.slot_price_per_hour_usd(True),
                                         "lifetime_model": _lifetime(o)}
                          for o in offerings],
            "sources": list(catalog.sources),
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    _print_table(catalog, offerings)


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _lifetime(o) -> str:  # noqa: ANN001 - an Offering
    """The offering's lifetime model as the table shows it: ``exponential @ 5-10% (assumed, 2026-11-29)``, or
    ``weibull fitted from bamboo_p3-trace.csv (2026-12-03)`` where a trace fit replaces the catalog's rate."""
    if o.market == "spot" and o.gpu:
        fit = offering_lifetime(o, o.gpu.lower()).fit  # the spot market's decision: a trace's fit, else the rate
        if fit is not None:
            files = ", ".join(Path(part).name for part in fit.source.split(" + "))
            return f"{fit.model.name} fitted from {files} ({fit.fitted_on or 'undated'})"
    if o.market == "preemptible":
        return f"{o.lifetime} fitted on GCE preemptible lifetimes (measured 2018-2019)"
    if o.interruption_rate is None:
        return o.lifetime
    shape = f" k={o.lifetime_shape:g}" if o.lifetime == "weibull" and o.lifetime_shape else ""
    assumed = "assumed, " if "assumed" in o.interruption_source.lower() else ""
    return f"{o.lifetime}{shape} @ {o.interruption_rate} ({assumed}{o.interruption_as_of or 'undated'})"


def _print_table(catalog, offerings) -> None:  # noqa: ANN001 - Catalog/Offering, imported lazily
    from rich.markup import escape
    from rich.table import Table

    from cmdare.console import console as make_console

    table = Table(title="cmdare server catalog (USD per hour per server; per GPU when a server has several); "
                  "market and lifetime model of the transient price")
    cols = ("cloud", "region", "gpu", "TFLOPS", "machine", "GPUs", "on-demand", "spot", "market", "lifetime", "as of",
            "source")
    for col in cols:
        table.add_column(col, overflow="fold")
    for o in offerings:
        tflops = f"{catalog.gpus[o.gpu].tflops_fp32:g}" if o.gpu else "-"
        gpu = (o.gpu or "CPU (PS)") + (" (retired)" if o.retired else "")
        od, spot = o.on_demand_usd_per_h, o.spot_usd_per_h
        if o.gpus_per_server > 1:
            od_s = f"{_money(od)} ({_money(o.slot_price_per_hour_usd(False))}/GPU)"
            spot_s = f"{_money(spot)} ({_money(o.slot_price_per_hour_usd(True))}/GPU)"
        else:
            od_s, spot_s = _money(od), _money(spot)
        source = o.source + (" - " + o.note if o.note else "")
        cells = (o.cloud, o.region, gpu, tflops, o.machine_type, str(o.gpus_per_server), od_s, spot_s, o.market,
                 _lifetime(o), o.as_of, source)
        table.add_row(*(escape(c) for c in cells))
    make_console().print(table)
