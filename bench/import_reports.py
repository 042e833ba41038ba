"""Benchmark: import all the public data and generate every report (tables and PNG plots).

Measures the wall time of the imports and of each report, and peak memory as the process's peak RSS
(tracemalloc is not used: it slows the numpy/scipy fits several-fold). The store is a fresh SQLite
file, and a fresh PostgreSQL database when CMDARE_BENCH_PG_URL or CMDARE_TEST_PG_URL is set. A second
import of the same data (idempotent: adds nothing) is timed as the baseline of reading and hashing only.

Usage: python bench/import_reports.py [DATA_DIR]   (default: the public data bundled with cmdare)
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from cmdare.measure.importers.cmdare_data import import_cmdare_dir
from cmdare.measure.importers.lifetimes import import_lifetimes
from cmdare.measure.reports import build_report
from cmdare.measure.store import open_store

REPORTS = ("lifetimes", "scaling", "startup", "checkpoint")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(url: str, data: Path, out_dir: Path) -> dict[str, object]:
    store = open_store(url)
    lifetimes = [data / "lifetimes" / "gce_gpu_lifetimes.csv", data / "lifetimes" / "gce_cpu_preemptions.json"]
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    a = import_cmdare_dir(store, data / "cmdare")
    b = import_lifetimes(store, lifetimes)
    import_s = time.perf_counter() - t0
    t = time.perf_counter()
    import_cmdare_dir(store, data / "cmdare")
    import_lifetimes(store, lifetimes)
    reimport_s = time.perf_counter() - t
    report_s = {}
    for name in REPORTS:
        t = time.perf_counter()
        rep = build_report(name, store)
        rep.render("table")
        rep.save_plot(out_dir / f"{name}.png")
        report_s[name] = time.perf_counter() - t
    total_s = time.perf_counter() - t0
    store.close()
    return {
        "rows_imported": a.imported + b.imported,
        "rows_read": a.read + b.read,
        "import_s": import_s,
        "reimport_s": reimport_s,
        "report_s": report_s,
        "total_s": total_s,
        "peak_rss_before_mb": rss0,
        "peak_rss_mb": _rss_mb(),
    }


def main() -> None:
    from cmdare.public_data import public_data_dir

    data = Path(sys.argv[1]) if len(sys.argv) > 1 else public_data_dir()
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = bench(f"sqlite:///{Path(tmp) / 'b.db'}", data, Path(tmp))
        print("sqlite", json.dumps(out["sqlite"]))
        pg = os.environ.get("CMDARE_BENCH_PG_URL") or os.environ.get("CMDARE_TEST_PG_URL")
        if pg:
            from sqlalchemy import create_engine, text
            from sqlalchemy.engine import make_url

            base = make_url(pg)
            name = f"cmdare_bench_imp_{os.getpid()}"
            admin = create_engine(base, isolation_level="AUTOCOMMIT")
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            try:
                out["postgresql"] = bench(base.set(database=name).render_as_string(False), data, Path(tmp))
                print("postgresql", json.dumps(out["postgresql"]))
            finally:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    out["peak_rss_mb"] = _rss_mb()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
