"""``cmdare train LINE`` against ``cmdare train LINE --simulate --runs 1``: the emulated run and its simulation.

For each command line (the main job's defaults, ``cmdare train --transient`` plus):

* ``async``: ``--transient``
* ``sync``: ``--transient --sync``
* ``ps-transient``: ``--transient --ps-transient`` (PS servers revoked too, after the cloud's notice)
* ``warm-spares``: ``--transient --warm-spares 2``

and each seed, the bench runs

(a) the emulated training, ``cmdare train LINE --steps N --seed S``: a real local run on its own Ray instance,
    revocations injected by the default ``lifetime=bathtub,speedup=7200`` (README: the default of a local run),
    and reads back what it did from the store of a fresh temporary ``CMDARE_HOME`` (one per bench invocation);
(b) ``cmdare train LINE --steps N --seed S --simulate --runs 1 --json``: the planner's simulation of that very run
    (the first simulated run with a seed draws the lifetimes the trainer draws, ``docs/planner.md``),

and puts side by side, per line and seed (``train`` / ``sim``):

=======================  ============================================================  ===============================
field                    train (the run, read back from the store)                     sim (``--simulate --json``)
=======================  ============================================================  ===============================
``revocations``          the run summary's ``revocations`` (``events.is_revocation``)  ``revocations_mean``
``revocations_workers``  events ``revocation`` + ``notice``                            ``len(revocation_times_s)`` (1)
``revocations_ps``       events ``ps_notice`` + ``ps_revocation`` without notice       ``revocations_mean`` - (1)
``replacements``         the run summary's ``replacements`` (workers and PS)           ``replacements_mean``
``evacuations``          summary ``shards_evacuated``                                  ``evacuations_mean``
``parks``                summary ``shards_parked``                                     ``parks_mean``
``checkpoints``          rows of the store's ``checkpoints`` table (stored ones)       null: the JSON has no count
``steps_lost``           summary ``steps_lost`` + ``steps_rolled_back``                ``steps_lost_mean``
``cost_usd``             the run's ``cost_usd`` (catalog prices, emulated time)        ``cost_usd.mean``
``time_s``               the run's emulated cloud time at its end (see below)          ``time_s.mean``
=======================  ============================================================  ===============================

(1) The JSON has no split of revocations by role; ``revocation_times_s`` lists the first simulated run's worker
revocations (``plan.markets.revocation_stats``), which with ``--runs 1`` is the run, so the split is derived from it.

The store does not keep a local run's emulated cloud time (``run_simulation.against_plan`` says so too), so the
bench starts ``cmdare train`` through a small launcher (``cmdare.cli.main`` with the same argv) that adds
``Trainer.controller.now`` at the run's end to the summary's details as ``bench_cloud_end_s`` (recorded in the
store with the rest of the summary); nothing the run decides reads it. Without it (a run that never built its
controller) ``time_s`` is null. A field one side does not give is null on that side, never guessed, and its
agreement is null. ``agree`` is exact equality (costs too: differences of whole-second billing count);
``agree_counts`` per line counts the seeds where a field agrees, ``mean_abs_diff`` is over the seeds where both
sides have the field; ``close`` (``close_counts``) allows a relative ``1e-9``: float rounding only.

The ``cmdare`` command is ``sys.executable -c 'from cmdare.cli import main; main()'`` with this process's
environment, so ``PYTHONPATH=SNAPSHOT/src`` runs a snapshot's code (``cmdare_source`` in the JSON says which file
was imported by each side). Usage::

    PYTHONPATH=src .venv/bin/python bench/train_vs_simulate.py [--seeds 1,2,3,4,5] [--steps 300]
        [--lines async,sync,ps-transient,warm-spares] [--timeout-s 900] [--keep]

Prints a table, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The command lines compared, by name: ``cmdare train --transient`` plus these options.
LINES: dict[str, list[str]] = {
    "async": ["--transient"],
    "sync": ["--transient", "--sync"],
    "ps-transient": ["--transient", "--ps-transient"],
    "warm-spares": ["--transient", "--warm-spares", "2"],
}

#: (field, what the simulation JSON calls it: a key, a (key, subkey) pair, or None: not in the JSON)
FIELDS: list[tuple[str, Any]] = [
    ("revocations", "revocations_mean"),
    ("revocations_workers", "revocation_times_s"),
    ("revocations_ps", "revocation_times_s"),
    ("replacements", "replacements_mean"),
    ("evacuations", "evacuations_mean"),
    ("parks", "parks_mean"),
    ("checkpoints", None),
    ("steps_lost", "steps_lost_mean"),
    ("cost_usd", ("cost_usd", "mean")),
    ("time_s", ("time_s", "mean")),
]

#: ``cmdare`` as a command, with the run's emulated cloud time at its end kept in the summary's details.
LAUNCHER = """
import sys
import cmdare
from cmdare.train import trainer as _trainer

_summary = _trainer.Trainer._summary


def _with_cloud_time(self, status, t_start):
    out = _summary(self, status, t_start)
    out.details["bench_cloud_end_s"] = self.controller.now if self.controller is not None else None
    out.details["bench_emulated_time"] = bool(self.emulated_time)
    out.details["bench_cmdare_source"] = cmdare.__file__
    return out


_trainer.Trainer._summary = _with_cloud_time
print(f"tvs-launcher: cmdare from {cmdare.__file__}", file=sys.stderr, flush=True)
from cmdare.cli import main

sys.argv[0] = "cmdare"
main()
"""

_WORKER_REVOCATIONS = ("revocation", "notice")
#: Relative tolerance of ``close``: a difference of float rounding only (sums of step times in another order).
CLOSE = 1e-9


def cmdare(args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """``cmdare ARGS`` (the launcher) in ``env``; raises with its stderr's tail when it fails."""
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"cmdare {' '.join(args)} exited {proc.returncode}:\n{tail}")
    return proc


def _source(stderr: str) -> str | None:
    m = re.search(r"tvs-launcher: cmdare from (\S+)", stderr)
    return m.group(1) if m else None


def run_ids(store: Any) -> set[str]:
    """The run ids in the store."""
    from cmdare.measure.store.schema import Run

    with store.session() as s:
        return {r for (r,) in s.query(Run.run_id).all()}


def read_run(store: Any, run_id: str) -> dict[str, Any]:
    """What run ``run_id`` did, from the store (see the module docstring)."""
    from cmdare.events import is_revocation
    from cmdare.measure.store.schema import Checkpoint, Event, Run

    with store.session() as s:
        run = s.get(Run, run_id)
        summary = dict(run.summary or {})
        events = [(e.kind, dict(e.details or {})) for e in s.query(Event).filter_by(run_id=run_id).all()]
        checkpoints = s.query(Checkpoint).filter_by(run_id=run_id).count()
        status, final_step, cost = run.status, run.final_step, run.cost_usd
    workers = sum(1 for k, _ in events if k in _WORKER_REVOCATIONS)
    ps = sum(1 for k, d in events if k.startswith("ps_") and is_revocation(k, d))
    lost = summary.get("steps_lost")
    if lost is not None:
        lost = lost + summary.get("steps_rolled_back", 0)
    return {
        "run_id": run_id,
        "status": status,
        "final_step": final_step,
        "revocations": summary.get("revocations"),
        "revocations_workers": workers,
        "revocations_ps": ps,
        "replacements": summary.get("replacements"),
        "evacuations": summary.get("shards_evacuated"),
        "parks": summary.get("shards_parked"),
        "checkpoints": checkpoints,
        "steps_lost": lost,
        "cost_usd": cost,
        "time_s": summary.get("bench_cloud_end_s"),
        "standbys_lost": sum(1 for k, _ in events if k == "standby_lost"),
        "emulated_time": summary.get("bench_emulated_time"),
        "cmdare_source": summary.get("bench_cmdare_source"),
    }


def read_simulation(out: dict[str, Any]) -> dict[str, Any]:
    """The fields of one ``--simulate --runs 1 --json`` answer (null where the JSON has none)."""
    row: dict[str, Any] = {}
    for name, key in FIELDS:
        if key == "revocation_times_s":  # the worker revocations of the first (here the only) simulated run
            times, total = out.get(key), out.get("revocations_mean")
            workers = len(times) if isinstance(times, list) and out.get("runs") == 1 else None
            ps = total - workers if workers is not None and total is not None else None
            row[name] = workers if name == "revocations_workers" else ps
        elif key is None:
            row[name] = None
        elif isinstance(key, tuple):
            row[name] = (out.get(key[0]) or {}).get(key[1])
        else:
            row[name] = out.get(key)
    row["finished_fraction"] = out.get("finished_fraction")
    row["not_simulated"] = out.get("not_simulated")
    row["revocation_times_s"] = out.get("revocation_times_s")
    return row


def compare_one(line: str, seed: int, steps: int, env: dict[str, str], store: Any, timeout_s: float) -> dict[str, Any]:
    """One line and seed: the run, its simulation and the fields side by side."""
    args = ["train", *LINES[line], "--steps", str(steps), "--seed", str(seed)]
    before = run_ids(store)
    t0 = time.perf_counter()
    proc = cmdare(args, env, timeout_s)
    train_wall = time.perf_counter() - t0
    new = sorted(run_ids(store) - before)
    if len(new) != 1:
        raise RuntimeError(f"{' '.join(args)}: expected one new run in the store, found {new}")
    train = read_run(store, new[0])
    t0 = time.perf_counter()
    sproc = cmdare([*args, "--simulate", "--runs", "1", "--json"], env, timeout_s)
    sim_wall = time.perf_counter() - t0
    sim = read_simulation(json.loads(sproc.stdout.strip().splitlines()[-1]))
    row: dict[str, Any] = {"line": line, "seed": seed, "run_id": train["run_id"], "status": train["status"],
                           "final_step": train["final_step"], "fields": {}}
    for name, _ in FIELDS:
        a, b = train.get(name), sim.get(name)
        both = a is not None and b is not None
        row["fields"][name] = {"train": a, "sim": b, "agree": (a == b) if both else None,
                               "close": abs(a - b) <= CLOSE * max(1.0, abs(a), abs(b)) if both else None,
                               "abs_diff": abs(a - b) if both else None}
    row["train_extra"] = {k: train[k] for k in ("standbys_lost", "emulated_time", "cmdare_source")}
    row["train_extra"]["launcher_source"] = _source(proc.stderr)
    row["sim_extra"] = {k: sim[k] for k in ("finished_fraction", "not_simulated", "revocation_times_s")}
    row["sim_extra"]["launcher_source"] = _source(sproc.stderr)
    row["wall_s"] = {"train": round(train_wall, 1), "simulate": round(sim_wall, 1)}
    return row


def aggregate(rows: list[dict[str, Any]], lines: list[str]) -> dict[str, Any]:
    """Per line: seeds agreeing exactly per field, the mean absolute difference, the rows."""
    out: dict[str, Any] = {}
    for line in lines:
        mine = [r for r in rows if r["line"] == line]
        agree, close, mad = {}, {}, {}
        for name, _ in FIELDS:
            cells = [r["fields"][name] for r in mine]
            known = [c for c in cells if c["agree"] is not None]
            agree[name] = sum(bool(c["agree"]) for c in known) if known else None
            close[name] = sum(bool(c["close"]) for c in known) if known else None
            mad[name] = sum(c["abs_diff"] for c in known) / len(known) if known else None
        out[line] = {"seeds": len(mine), "agree_counts": agree, "close_counts": close, "mean_abs_diff": mad,
                     "rows": mine}
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.6f}" if abs(v) < 0.1 else f"{v:.3f}"
    return str(v)


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per line and seed: train/sim per field, ``*`` where they differ."""
    names = [n for n, _ in FIELDS]
    short = {"revocations": "revoc", "revocations_workers": "rev_w", "revocations_ps": "rev_ps",
             "replacements": "repl", "evacuations": "evac", "parks": "parks", "checkpoints": "ckpts",
             "steps_lost": "lost", "cost_usd": "cost_usd", "time_s": "time_s"}
    cells = []
    for r in rows:
        c = [r["line"], str(r["seed"])]
        for n in names:
            f = r["fields"][n]
            mark = "" if f["agree"] is not False else "~" if f["close"] else "*"
            c.append(f"{_fmt(f['train'])}/{_fmt(f['sim'])}{mark}")
        cells.append(c)
    header = ["line", "seed", *(short[n] for n in names)]
    widths = [max(len(x) for x in col) for col in zip(header, *cells, strict=True)]
    print(f"train/sim per field (* differs; ~ differs by float rounding only, under {CLOSE:g} relative; "
          "- not available from that side)")
    for c in [header, *cells]:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lines", default=",".join(LINES), help=f"comma-separated subset of {', '.join(LINES)}")
    p.add_argument("--timeout-s", type=float, default=900.0, help="per cmdare command")
    p.add_argument("--keep", action="store_true", help="keep the temporary CMDARE_HOME (its path is printed)")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    lines = [x.strip() for x in a.lines.split(",") if x.strip()]
    unknown = [x for x in lines if x not in LINES]
    if unknown:
        p.error(f"unknown line(s) {', '.join(unknown)}; valid: {', '.join(LINES)}")

    home = Path(tempfile.mkdtemp(prefix="cmdare-tvs-"))
    env = {k: v for k, v in os.environ.items() if k not in ("CMDARE_DB_URL", "CMDARE_STORAGE",
                                                          "CMDARE_STORAGE_OPTIONS", "CMDARE_CATALOG")}
    env["CMDARE_HOME"] = str(home)
    os.environ.update({"CMDARE_HOME": str(home)})
    os.environ.pop("CMDARE_DB_URL", None)
    import cmdare
    from cmdare.measure.store import open_store

    t_all = time.perf_counter()
    rows: list[dict[str, Any]] = []
    store = open_store(f"sqlite:///{home / 'cmdare.db'}")
    try:
        for line in lines:
            for seed in seeds:
                t = time.perf_counter()
                rows.append(compare_one(line, seed, a.steps, env, store, a.timeout_s))
                print(f"# {line} seed {seed}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    finally:
        store.close()
        if a.keep:
            print(f"# CMDARE_HOME kept: {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    print_table(rows)
    result = {
        "lines": aggregate(rows, lines),
        "fields": [n for n, _ in FIELDS],
        "not_available": {"sim": [n for n, k in FIELDS if k is None]},
        "total_wall_s": round(time.perf_counter() - t_all, 1),
        "cmdare_source": cmdare.__file__,
        "config": {"seeds": seeds, "steps": a.steps, "lines": {x: LINES[x] for x in lines},
                   "revocations": "lifetime=bathtub,speedup=7200 (the local default)", "runs": 1},
        "loadavg_1m": os.getloadavg()[0],
    }
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
