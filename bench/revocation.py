"""Worker revocations on a local multi-node Ray cluster: detection delay, recovery time, throughput.

Each worker server is a Ray node of its own (:class:`cmdare.cloud.local.LocalClusterProvider`). A revocation
here is a *real failure*, not an emulated one: every ``--every`` global steps (the first at ``--first``) the
bench removes a worker's node without grace (``cluster.remove_node(..., allow_graceful=False)``, its processes
killed) behind the run's back, so the run learns it the way it learns of a real failure, through Ray (an
emulated revocation is known at once: the controller decided it). Replacements start with no emulated
provisioning delay (``startup='0'``), so recovery measures only what the engine and Ray do.

Per revocation (the bench's kill times and the run's :class:`EventReport` s):

* detection delay: node removal to the controller's ``worker_lost``; ``from_kill_start`` from the start of the
  removal, ``from_node_death`` from its end (the node's processes dead). The < 1 s target refers to
  ``from_node_death``.
* recovery: node removal (its start) to the replacement's first step (``replacement_trained``: the start of its
  first chunk, after its first pull), broken down
  (``breakdown_median_s``) into detection, node start (``cluster.add_node``, timed by a provider
  subclass; 0 for a warm spare, whose node was up), actor start (cold: node up -> worker process up with
  torch imported and the model built; warm: loss handled -> the spare adopted as the worker), first pull
  (worker up -> its first chunk starts; ``pull_only``: the pull itself) and first step.

With ``--warm-spares N`` (default 2) the run keeps up to N standby servers whose worker process is warm
(``TrainSpec.warm_spares``; the controller's policy, :mod:`cmdare.control.spares`, sizes the pool for the losses due
within a spare's start): a replacement takes the one up longest, else the one furthest into its start.
``--warm-spares 0`` measures the cold path alone; ``--cold-baseline`` runs it first, back to back, and reports its
figures under ``cold_baseline``. Every worker node's raylet prestarts its process with torch and cmdare imported;
``--ready-nodes K`` (default 3: a node and its imports take ~6 s while four workers train on these 2 cores, a node
is lost every ~2.5 s) has the local provider keep K idle nodes for the servers asked for next
(``LocalClusterProvider(ready_nodes=K)``: the emulated start-up is ``'0'``, so the local node's own start and
imports are kept out of it). ``standby_phases_median_s`` splits a standby's start: queued for the node starter,
node start, node up -> its ``__init__`` runs (placement, and the prestarted process's imports if not done), init
(data, model, one step). ``startup_probe_median_s`` times fresh nodes with the run over: ``cold`` (Ray's default
process) and ``prestarted`` (the actor created as the node comes up).

Usage: .venv/bin/python bench/revocation.py [--workers 4] [--steps 1600] [--every 250] [--first 150]
       [--warm-spares 2] [--ready-nodes 3] [--cold-baseline]
Prints one JSON object as its last line; the throughput plot goes to docs/images/revocation_throughput.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cmdare.train.run.ray_session import start_local_cluster  # before Ray is imported: Ray on 127.0.0.1

IMG = Path(__file__).resolve().parent.parent / "docs" / "images"


def _quantiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"n": 0, "median": None, "p10": None, "p90": None, "min": None, "max": None}
    xs = sorted(xs)

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    return {"n": len(xs), "median": round(statistics.median(xs), 3), "p10": round(q(0.1), 3),
            "p90": round(q(0.9), 3), "min": round(xs[0], 3), "max": round(xs[-1], 3)}


class Probe:
    """A bare actor on a fresh node: separates process start from imports and model set-up."""

    def ready(self) -> float:
        return time.time()

    def setup(self, model: str) -> dict[str, float]:
        t0 = time.perf_counter()
        import torch  # noqa: F401

        import cmdare.train.workers.worker  # noqa: F401
        t1 = time.perf_counter()
        from cmdare.datasets import load_dataset
        from cmdare.workloads import build_model

        data = load_dataset("digits", None, seed=5)
        build_model(model, num_classes=data.num_classes, in_channels=data.input_shape[0])
        return {"imports": t1 - t0, "data_and_model": time.perf_counter() - t1}


def probe_startup(cluster: Any, model: str, n: int, prestart: bool = False) -> dict[str, float | None]:
    """Median node start, actor process start, imports, data + model set-up over ``n`` fresh nodes, the actor
    created as soon as the node is up (``prestart``: the node's raylet prestarts its process with torch and cmdare
    imported, as a worker node's does)."""
    import ray

    from cmdare.cloud.detection import WORKER_PRESTART_ENV

    rows: dict[str, list[float]] = {"node_start": [], "actor_process_start": [], "imports": [],
                                    "data_and_model": []}
    for i in range(n):
        t0 = time.time()
        node = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={f"probe{i}": 1},
                                env_vars=dict(WORKER_PRESTART_ENV) if prestart else None)
        t1 = time.time()
        actor = ray.remote(Probe).options(resources={f"probe{i}": 1}, num_cpus=1).remote()
        ready_at = ray.get(actor.ready.remote())
        got = ray.get(actor.setup.remote(model))
        rows["node_start"].append(t1 - t0)
        rows["actor_process_start"].append(ready_at - t1)
        rows["imports"].append(got["imports"])
        rows["data_and_model"].append(got["data_and_model"])
        ray.kill(actor)
        cluster.remove_node(node)
    return {k: _quantiles(v)["median"] for k, v in rows.items()}


def plot(cb: Any, path: Path, load: float, workers: int) -> None:
    """Cluster steps/s over time (1 s bins from chunk reports) with revocations and recoveries marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    t0 = cb.steps[0].time
    end = cb.steps[-1].time - t0
    bins = np.arange(0.0, end + 1.0, 1.0)
    prev = cb.steps[0].global_step
    counts = np.zeros(len(bins))
    for r in cb.steps[1:]:
        counts[min(int((r.time - t0) // 1.0), len(bins) - 1)] += r.global_step - prev
        prev = r.global_step
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), gridspec_kw={"height_ratios": [2, 1.3]})
    ax = axes[0]
    ax.plot(bins, np.convolve(counts, np.ones(2) / 2, mode="same"), lw=1, label="global steps/s (2 s mean)")
    ax.plot([r.time - t0 for r in cb.steps], [r.cluster_steps_per_s for r in cb.steps], lw=1, alpha=0.7,
            label="coordinator's 5 s window")
    for kind, color in (("revocation", "tab:red"), ("replacement_trained", "tab:green")):
        for i, e in enumerate(x for x in cb.events if x.kind == kind):
            ax.axvline(e.time - t0, color=color, lw=0.8, ls="--", label=kind if i == 0 else None)
    ax.set_ylabel("global steps/s")
    ax.set_title(f"{workers} workers, each a Ray node; revocation = node removed (shared 2-core machine, "
                 f"load ~{load:.0f})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    # zoom on the first revocation whose replacement joined
    ax2 = axes[1]
    rev = [e for e in cb.events if e.kind == "revocation"]
    joined = [e for e in cb.events if e.kind == "replacement_trained"]
    if rev and joined:
        others = [e.time for e in rev]

        def isolation(e: Any) -> float:
            return min([abs(e.time - t) for t in others if t != e.time] or [1e9])

        r0 = max(rev[1:-1] or rev, key=isolation)
        lo, hi = r0.time - t0 - 5, r0.time - t0 + 25
        sel = (bins >= lo) & (bins <= hi)
        ax2.bar(bins[sel], counts[sel], width=0.9, align="edge", color="tab:blue", alpha=0.7)
        for e in cb.events:
            if e.kind in ("revocation", "worker_lost", "replacement_trained") and lo <= e.time - t0 <= hi:
                c = {"revocation": "tab:red", "worker_lost": "tab:orange", "replacement_trained": "tab:green"}[e.kind]
                ax2.axvline(e.time - t0, color=c, lw=1.2, label=e.kind)
        handles, names = ax2.get_legend_handles_labels()
        uniq = dict(zip(names, handles, strict=True))
        ax2.set_xlim(lo, hi)
        ax2.legend(uniq.values(), uniq.keys(), fontsize=7, loc="upper right")
    ax2.set_xlabel("time since first chunk (s)")
    ax2.set_ylabel("steps in 1 s bin")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_once(args: argparse.Namespace, warm_spares: int, t_bench: float) -> dict[str, Any]:
    """One run on a fresh local multi-node cluster; its figures (and the run's reports for the plot)."""
    import ray

    from cmdare.cloud.detection import LOCAL_FAILURE_DETECTION
    from cmdare.cloud.local import LocalClusterProvider
    from cmdare.ps.optimizer import OptimizerConfig
    from cmdare.train import Trainer, TrainSpec
    from cmdare.train.callbacks import TrainCallback

    class Collect(TrainCallback):
        """Records the run's reports; removes a worker's node every ``args.every`` steps (a real failure)."""

        def __init__(self) -> None:
            self.steps: list[Any] = []
            self.events: list[Any] = []
            self.kills: dict[int, tuple[float, float]] = {}  # worker id -> (removal started, removal ended)
            self.next_kill = args.first
            self.trainer: Any = None
            self.rng = random.Random(1)

        def on_step(self, report: Any) -> None:
            self.steps.append(report)
            if report.global_step < self.next_kill or self.trainer is None:
                return
            self.next_kill = report.global_step + args.every
            live = [w for w in self.trainer.workers.values() if w.server.node is not None and w.is_up
                    and w.worker_id not in self.kills]
            if live:
                w = self.rng.choice(live)
                t0 = time.time()
                cluster.remove_node(w.server.node, allow_graceful=False)
                self.kills[w.worker_id] = (t0, time.time())
                print(f"{time.time() - t_bench:7.1f}s step {report.global_step:5d} node of worker {w.worker_id} "
                      "removed", file=sys.stderr, flush=True)

        def on_event(self, report: Any) -> None:
            self.events.append(report)
            if report.kind in ("worker_lost", "replacement_trained"):
                keys = ("detection_delay_s", "recovery_s", "warm")
                got = {k: round(report.details[k], 2) for k in keys if k in report.details}
                print(f"{time.time() - t_bench:7.1f}s step {report.global_step:5d} {report.kind} {got}",
                      file=sys.stderr, flush=True)

    class TimedProvider(LocalClusterProvider):
        """Times node start per server (on the provider's start thread) and the coordinator's call."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.node_start: dict[str, tuple[float, float]] = {}
            self.blocked: dict[str, float] = {}

        def prepare(self, server: Any, background: bool = False) -> None:
            t0 = time.time()
            super().prepare(server, background)
            self.blocked[server.server_id] = time.time() - t0
            sid = server.server_id
            future = self._starting.get(sid)
            if future is not None:
                future.add_done_callback(lambda _f: self.node_start.__setitem__(sid, (t0, time.time())))
            elif server.node is not None:  # started in the foreground (before the first revocation)
                self.node_start[sid] = (t0, time.time())

    logging.getLogger("ray").setLevel(logging.ERROR)
    load_start = os.getloadavg()[0]
    cluster = start_local_cluster(num_cpus=3, resources={"cmdare_ps": 100}, _system_config=LOCAL_FAILURE_DETECTION)
    spec = TrainSpec(model=args.model, dataset="digits", workers=args.workers, ps=1, steps=args.steps,
                     batch_size=32, optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0,
                     seed=5, transient=True, revocations="none", replace="same", startup="0",
                     chunk_steps=args.chunk_steps, warm_spares=warm_spares)
    cb = Collect()
    provider = TimedProvider(cluster, ready_nodes=args.ready_nodes)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(spec, [cb], checkpoint_dir=tmp, provider=provider)
            cb.trainer = trainer
            summary = trainer.run()
        probe = ({"cold": probe_startup(cluster, args.model, args.probes),
                  "prestarted": probe_startup(cluster, args.model, args.probes, prestart=True)}
                 if args.probes else {})
    finally:
        ray.shutdown()
        cluster.shutdown()
    out = figures(cb, provider, summary, load_start, warm_spares)
    out["startup_probe_median_s"] = probe
    out["warm_spares"], out["ready_nodes"] = warm_spares, args.ready_nodes
    out["_reports"] = cb
    return out


def figures(cb: Any, provider: Any, summary: Any, load_start: float, warm_spares: int) -> dict[str, Any]:
    """Detection, recovery and its breakdown per replacement, from the kill times and the run's events."""
    lost = {e.worker_id: e for e in cb.events if e.kind == "worker_lost"}
    joined = [e for e in cb.events if e.kind == "replacement_trained"]
    requested = {e.server_id: e for e in cb.events if e.kind == "replacement_requested"}
    standbys = [e.server_id for e in cb.events if e.kind == "standby_requested"]
    kill_s = [end - start for start, end in cb.kills.values()]
    det_start = [lost[w].time - start for w, (start, _end) in cb.kills.items() if w in lost]
    det_end = [lost[w].time - end for w, (_start, end) in cb.kills.items() if w in lost]
    # warm: the spare taken was up; spare_starting: it was still starting (a head start on a cold start)
    recovery: dict[str, list[float]] = {"all": [], "warm": [], "spare_starting": [], "cold": []}
    parts: dict[str, list[float]] = {k: [] for k in ("detection", "coordinator_until_node_start", "node_start",
                                                     "actor_start", "first_pull", "pull_only", "first_step",
                                                     "actor_start_imports_first_pull")}
    for j in joined:
        w_old, warm = j.details["replaces_worker"], bool(j.details.get("warm"))
        if w_old not in cb.kills or w_old not in lost:
            continue
        kind = {"up": "warm", "starting": "spare_starting"}.get(j.details.get("spare") or "", "cold")
        killed_at = cb.kills[w_old][0]
        first_at = j.details["joined_at"]  # the first chunk's start, after the first pull
        recovery["all"].append(first_at - killed_at)
        recovery[kind].append(first_at - killed_at)
        up = j.details.get("worker_up_at")  # the worker's process up and its model built
        parts["detection"].append(lost[w_old].time - killed_at)
        if warm:  # no node starts: the spare's process becomes the worker (adopt) and pulls
            parts["node_start"].append(0.0)
            parts["actor_start_imports_first_pull"].append(first_at - lost[w_old].time)
            if up is not None:
                parts["actor_start"].append(up - lost[w_old].time)
            parts["pull_only"].append(j.details.get("first_pull_s", float("nan")))
        elif j.server_id in provider.node_start:
            n0, n1 = provider.node_start[j.server_id]
            parts["coordinator_until_node_start"].append(n0 - lost[w_old].time)
            parts["node_start"].append(n1 - n0)
            parts["actor_start_imports_first_pull"].append(first_at - n1)
            if up is not None:
                parts["actor_start"].append(up - n1)
        if up is not None:
            parts["first_pull"].append(first_at - up)
        first = [s for s in cb.steps if s.worker_id == j.worker_id]
        if first:
            parts["first_step"].append(first[0].duration_s / max(1, first[0].steps))
    med = {k: _quantiles(v)["median"] for k, v in parts.items()}
    standby_phases = _standby_phases(cb, provider)
    standby_start = [provider.node_start[s][1] - provider.node_start[s][0] for s in standbys
                     if s in provider.node_start]
    ready = {e.server_id: e.details.get("startup_s") for e in cb.events if e.kind == "standby_ready"}
    idle = [e.details["standby_idle_s"] for e in cb.events if e.kind == "replacement_requested"
            and "standby_idle_s" in e.details]
    return {
        "status": summary.status, "global_step": summary.global_step,
        "revocations": summary.revocations, "replacements": summary.replacements,
        "replacements_requested": len(requested),
        "warm_replacements": len(recovery["warm"]), "spare_starting_replacements": len(recovery["spare_starting"]),
        "cold_replacements": len(recovery["cold"]),
        "detection_from_kill_start_s": _quantiles(det_start),
        "detection_from_node_death_s": _quantiles(det_end),
        "kill_s": _quantiles(kill_s),
        "recovery_s": _quantiles(recovery["all"]),
        "recovery_warm_s": _quantiles(recovery["warm"]),
        "recovery_spare_starting_s": _quantiles(recovery["spare_starting"]),
        "recovery_cold_s": _quantiles(recovery["cold"]),
        "recovery_breakdown_median_s": {
            "detection_from_kill_start": med["detection"],
            "coordinator_until_node_start": med["coordinator_until_node_start"],
            "node_start": med["node_start"],
            "actor_start_imports_first_pull": med["actor_start_imports_first_pull"],
            "first_step_after_joined": med["first_step"],
        },
        # detection (kill start -> loss handled), node start (0 for a warm spare), actor start (cold: node up ->
        # process up, torch imported, model built; warm: loss handled -> the spare adopted), first pull (worker
        # up -> its first chunk starts; pull_only: the pull itself, warm), first step (the first chunk's mean)
        "breakdown_median_s": {k: med[k] for k in ("detection", "node_start", "actor_start", "first_pull",
                                                   "pull_only", "first_step")},
        "standbys_started": len(standbys),
        "standby_node_start_s": _quantiles(standby_start)["median"],
        "standby_startup_s": _quantiles([v for v in ready.values() if v is not None])["median"],
        "standby_idle_before_taken_s": _quantiles(idle)["median"],
        # a standby's start, median per phase: asked for -> its node starts (the provider starts one node at a
        # time), the node's start, node up -> the standby's __init__ runs (its process was prestarted with torch
        # imported, or starts now), __init__ (data, model, one step) -> up
        "standby_phases_median_s": standby_phases,
        # Time the coordinator's loop spent in provider.prepare (Trainer._start_worker): while it blocks, no
        # chunk is handed out to the surviving workers. Nodes now start on the provider's own thread.
        "coordinator_blocked_in_add_node_s": round(sum(v for sid, v in provider.blocked.items()
                                                       if sid in {j.server_id for j in joined} | set(requested)), 2),
        "training_span_s": round(cb.steps[-1].time - cb.steps[0].time, 2),
        "target_detection_s": 1.0, "target_recovery_s": 1.0 if warm_spares else 2.0,  # issue 46
        "mean_steps_per_s": summary.steps_per_s, "cost_usd": round(summary.cost_usd, 5),
        "load_avg_start": round(load_start, 1), "load_avg_end": round(os.getloadavg()[0], 1),
    }


def _standby_phases(cb: Any, provider: Any) -> dict[str, float | None]:
    """Median per phase of the standbys' starts (see ``standby_phases_median_s``)."""
    asked = {e.server_id: e.time for e in cb.events if e.kind == "standby_requested"}
    rows: dict[str, list[float]] = {"queued_for_node": [], "node_start": [], "placed_and_process": [],
                                    "init": []}
    for e in cb.events:
        if e.kind != "standby_ready" or e.server_id not in provider.node_start or e.server_id not in asked:
            continue
        n0, n1 = provider.node_start[e.server_id]
        init_at, up_at = e.details.get("init_at"), e.details.get("up_at", e.time)
        rows["queued_for_node"].append(n0 - asked[e.server_id])
        rows["node_start"].append(n1 - n0)
        if init_at is not None:
            rows["placed_and_process"].append(init_at - n1)
            rows["init"].append(up_at - init_at)
    return {k: _quantiles(v)["median"] for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--every", type=int, default=250, help="global steps between node removals")
    ap.add_argument("--first", type=int, default=150, help="the global step of the first removal")
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--chunk-steps", type=int, default=5)
    ap.add_argument("--warm-spares", type=int, default=2, help="standby servers (0: every replacement cold)")
    ap.add_argument("--ready-nodes", type=int, default=3,
                    help="idle nodes (processes prestarted) the local provider keeps for the next servers (0: none)")
    ap.add_argument("--cold-baseline", action="store_true",
                    help="first run the same job with no warm spares (its figures under 'cold_baseline')")
    ap.add_argument("--probes", type=int, default=3, help="fresh nodes timed for the start-up breakdown")
    args = ap.parse_args()
    t_bench = time.time()
    baseline = None
    if args.cold_baseline and args.warm_spares:
        baseline = run_once(args, 0, t_bench)
        baseline.pop("_reports")
    out = run_once(args, args.warm_spares, t_bench)
    cb = out.pop("_reports")
    out = {"workers": args.workers, "steps": args.steps, **out}
    if baseline is not None:
        out["cold_baseline"] = baseline
    out["wall_s"] = round(time.time() - t_bench, 1)
    plot(cb, IMG / "revocation_throughput.png", out["load_avg_start"], args.workers)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
