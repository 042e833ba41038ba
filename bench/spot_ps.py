"""Spot parameter servers: time, cost and final accuracy of on-demand PS vs spot PS under the same revocations.

Real :class:`cmdare.train.Trainer` runs of the README's main job with 2 parameter shards (resnet15 on
digits, 2 transient workers, ``--ps 2``, 500 steps, asynchronous, evaluation only at the end) on one
private local Ray, in three arms:

* ``on_demand_ps``: the shards on on-demand servers; the workers are revoked on a scripted schedule
  (``trace=T@SLOT+...``: slot 0 and slot 1 in turn every ``--worker-every`` seconds after the first step,
  the first after ``--worker-first``), each replaced (``replace=same``, ``startup=--startup`` s);
* ``spot_ps``: the shards on transient servers (``ps_transient=True``), the same worker schedule, plus a
  PS notice every ``--ps-every`` seconds (the first after ``--ps-first``) with ``notice=--notice`` seconds
  of lead: the coordinator evacuates the shard's blocks at an iteration boundary (onto the surviving
  shard, or onto the replacement when only one shard is left) and releases its server;
* ``fault_free``: no revocations (transient workers priced like ``on_demand_ps``'s), for the accuracy gap.

``spot_ps`` keeps the worker trace of ``on_demand_ps`` and adds ``T@ps`` entries (the longest-serving
transient PS server) to it, so both arms see the same worker revocations (``every=`` would pick at random
among workers and PS servers); everything after the pick (notice, deadline, evacuation, release,
replacement) is the engine's own path.

Arms alternate over ``--rounds`` (order rotated each round). Per arm: wall_s, steps_per_s, cost_usd,
final_accuracy, revocations, worker revocations, PS notices, shards_evacuated, steps_lost and each
evacuation's pause_s, moved_bytes, margin_s (deadline minus the evacuation's end) and wait_s (notice to
evacuated). The evacuation pause model (``cmdare.plan.evacuation.EvacuationModel.fit``) is fitted to every
(moved_bytes, pause_s) point measured.

Usage: .venv/bin/python bench/spot_ps.py [--rounds 1] [--steps 500] [--model resnet15] [--ps 2]
       [--worker-every 8] [--ps-every 10] [--notice 10] [--quick]
Progress goes to stderr; one JSON object is the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from _common import collector
from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1

ARMS = ("on_demand_ps", "spot_ps", "fault_free")
HORIZON_S = 600.0  # scripted revocations are listed this far ahead (entries after the run's end never fire)


def worker_trace(first_s: float, every_s: float, workers: int) -> str:
    """``trace=`` entries revoking the worker slots in turn: ``first_s``, then every ``every_s``."""
    entries, t, k = [], first_s, 0
    while t < HORIZON_S:
        entries.append(f"{t:g}@{k % workers}")
        t, k = t + every_s, k + 1
    return "+".join(entries)


def one_run(args: argparse.Namespace, arm: str, t_bench: float) -> dict[str, Any]:
    """One training run of ``arm``; its summary figures and evacuation events."""
    from cmdare.train import Trainer, TrainSpec

    ps_times = [args.ps_first + k * args.ps_every for k in range(int(HORIZON_S / args.ps_every))]
    trace = f"trace={worker_trace(args.worker_first, args.worker_every, args.workers)}"
    spot = f"{trace}+{'+'.join(f'{t:g}@ps' for t in ps_times)},notice={args.notice:g}"  # PS: T@ps entries
    revocations = {"on_demand_ps": trace, "spot_ps": spot, "fault_free": "none"}[arm]
    spec = TrainSpec(model=args.model, dataset="digits", workers=args.workers, ps=args.ps, steps=args.steps,
                     sync=False, checkpoint_every=args.checkpoint_every, eval_every=0, seed=args.seed,
                     transient=True, ps_transient=arm == "spot_ps", revocations=revocations, replace="same",
                     startup=f"{args.startup:g}")

    cb = collector()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = Trainer(spec, [cb], checkpoint_dir=tmp).run()
    run_s = time.perf_counter() - t0
    if summary.status != "finished":
        raise RuntimeError(f"{arm}: run ended {summary.status}")
    notices = {e.server_id: e for e in cb.events if e.kind == "ps_notice"}
    evacuations = []
    for e in (x for x in cb.events if x.kind == "shard_evacuated"):
        d = e.details
        noticed = notices.get(e.server_id)
        evacuations.append({"pause_s": round(d["pause_s"], 4), "moved_bytes": int(d["moved_bytes"]),
                            "margin_s": round(d["margin_s"], 3), "onto": d["onto"], "shard_id": d["shard_id"],
                            "wait_s": round(e.time - noticed.time, 3) if noticed else None,
                            "global_step": d.get("global_step")})
    out = {"wall_s": round(summary.wall_s, 2), "run_s": round(run_s, 2),
           "steps_per_s": round(summary.steps_per_s, 2), "cost_usd": round(summary.cost_usd, 6),
           "final_accuracy": summary.final_accuracy, "global_step": summary.global_step,
           "revocations": summary.revocations,
           "worker_revocations": sum(e.kind == "revocation" for e in cb.events),
           "replacements": summary.replacements,
           "ps_notices": len(notices), "ps_revocations": sum(e.kind == "ps_revocation" for e in cb.events),
           "ps_replacements_joined": sum(e.kind == "ps_replacement_joined" for e in cb.events),
           "shards_evacuated": summary.details.get("shards_evacuated", 0),
           "steps_lost": summary.details.get("steps_lost", 0), "evacuations": evacuations}
    print(f"{time.time() - t_bench:7.1f}s {arm}: {out['global_step']} steps in {out['wall_s']} s, "
          f"acc {out['final_accuracy']}, ${out['cost_usd']}, {out['worker_revocations']} worker revocations, "
          f"{out['ps_notices']} PS notices, {out['shards_evacuated']} evacuated, pauses "
          f"{[ev['pause_s'] for ev in evacuations]}", file=sys.stderr, flush=True)
    return out


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: the medians over rounds of the run figures (and every round's runs)."""
    keys = ("wall_s", "run_s", "steps_per_s", "cost_usd", "final_accuracy", "revocations", "worker_revocations",
            "replacements", "ps_notices", "ps_revocations", "ps_replacements_joined", "shards_evacuated",
            "steps_lost")
    out: dict[str, Any] = {}
    for arm, rs in runs.items():
        out[arm] = {k: _median([r[k] for r in rs]) for k in keys}
        out[arm]["evacuations"] = [ev for r in rs for ev in r["evacuations"]]
        out[arm]["rounds"] = [{k: r[k] for k in keys} for r in rs]
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--model", default="resnet15")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--worker-every", type=float, default=8.0, help="seconds between worker revocations")
    ap.add_argument("--worker-first", type=float, default=4.0)
    ap.add_argument("--ps-every", type=float, default=10.0, help="seconds between PS notices (spot_ps)")
    ap.add_argument("--ps-first", type=float, default=3.0)
    ap.add_argument("--notice", type=float, default=10.0, help="seconds from a PS notice to its revocation")
    ap.add_argument("--startup", type=float, default=1.0, help="emulated replacement start-up, seconds")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--num-cpus", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="a short smoke run (resnet8, 120 steps, 1 round)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.model = 1, 120, "resnet8"
        args.worker_first, args.worker_every, args.ps_first, args.ps_every = 1.5, 4.0, 0.5, 6.0
    load_start = os.getloadavg()
    t_bench = time.time()
    logging.getLogger("ray").setLevel(logging.ERROR)
    ray = start_local_ray(num_cpus=args.num_cpus)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    try:
        for rnd in range(args.rounds):
            order = ARMS[rnd % len(ARMS):] + ARMS[:rnd % len(ARMS)]
            for arm in order:
                runs[arm].append(one_run(args, arm, t_bench))
    finally:
        ray.shutdown()

    from cmdare.plan.evacuation import EvacuationModel

    res = summarize(runs)
    evac = res["spot_ps"]["evacuations"]
    pauses = [ev["pause_s"] for ev in evac]
    model = EvacuationModel.fit([(ev["moved_bytes"], ev["pause_s"]) for ev in evac],
                                f"fit to {len(evac)} evacuations of bench/spot_ps.py")
    acc_free, acc_spot = res["fault_free"]["final_accuracy"], res["spot_ps"]["final_accuracy"]
    gaps = [round(100 * (f["final_accuracy"] - s["final_accuracy"]), 2)
            for f, s in zip(runs["fault_free"], runs["spot_ps"], strict=True)]
    out = {
        "bench": "spot_ps", "model": args.model, "steps": args.steps, "workers": args.workers, "ps": args.ps,
        "rounds": args.rounds, "quick": args.quick,
        "schedule": {"worker_every_s": args.worker_every, "worker_first_s": args.worker_first,
                     "ps_every_s": args.ps_every, "ps_first_s": args.ps_first, "notice_s": args.notice,
                     "startup_s": args.startup, "checkpoint_every": args.checkpoint_every, "seed": args.seed},
        **res,
        "evacuation_pause_s": {"all": pauses, "median": _median(pauses),
                               "max": max(pauses) if pauses else None},
        "evacuation_margin_s_min": min((ev["margin_s"] for ev in evac), default=None),
        "evacuation_model": {"fixed_s": round(model.fixed_s, 4), "bytes_per_s": round(model.bytes_per_s, 1),
                             "events": model.events, "source": model.source},
        "accuracy_gap_points": (round(100 * (acc_free - acc_spot), 2)
                                if acc_free is not None and acc_spot is not None else None),
        "accuracy_gap_points_per_round": gaps,
        "accuracy_gap_on_demand_points": (round(100 * (acc_free - res["on_demand_ps"]["final_accuracy"]), 2)
                                          if acc_free is not None and res["on_demand_ps"]["final_accuracy"]
                                          is not None else None),
        "target_accuracy_gap_points": 1.0,
        "cost_ratio_spot_vs_on_demand": _ratio(res["spot_ps"]["cost_usd"], res["on_demand_ps"]["cost_usd"]),
        "time_ratio_spot_vs_on_demand": _ratio(res["spot_ps"]["wall_s"], res["on_demand_ps"]["wall_s"]),
        "load_avg": {"start": [round(x, 2) for x in load_start], "end": [round(x, 2) for x in os.getloadavg()]},
        "bench_wall_s": round(time.time() - t_bench, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
