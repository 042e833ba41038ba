"""Accuracy experiments (issue 8): staleness and final accuracy vs asynchronous workers, and the
learning-rate policy under injected revocations with replacement.

Real data: scikit-learn's digits, ResNet-8, a small step budget and a high learning rate so that stale
gradients matter. All runs share one local Ray instance.

    .venv/bin/python bench/accuracy_runs.py                    # full: ~15 min on 2 busy cores
    .venv/bin/python bench/accuracy_runs.py --seeds 1 --workers 1,4 --no-revocations   # quick look

Writes the raw per-run figures as JSON (``--out``), the plots ``docs/images/accuracy_*.png`` (``--plot-dir``)
and, with ``--db``, every run into a measurement store (so ``cmdare.predict.accuracy`` can fit from it).
The last line printed is one JSON object with the summary figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1


def _collector():
    from cmdare.train.callbacks import TrainCallback

    class Collect(TrainCallback):
        """Staleness per push, evaluation curve and membership events of one run."""

        def __init__(self) -> None:
            self.staleness: Counter = Counter()
            self.curve: list[tuple[int, float]] = []
            self.events: list[tuple[str, dict]] = []

        def on_step(self, report) -> None:
            self.staleness.update(int(s) for s in report.staleness)

        def on_eval(self, report) -> None:
            self.curve.append((int(report.global_step), float(report.accuracy)))

        def on_event(self, report) -> None:
            if report.kind in ("revocation", "replacement_joined", "lr_change", "worker_lost"):
                self.events.append((report.kind, dict(report.details)))

    return Collect()


def one_run(args, workers: int, seed: int, lr_policy: str = "unchanged", revocations: str | None = None) -> dict:
    """Train once and return its figures."""
    from cmdare.ps.optimizer import OptimizerConfig
    from cmdare.train import Trainer, TrainSpec

    spec = TrainSpec(
        model=args.model, dataset="digits", workers=workers, ps=1, steps=args.steps, batch_size=args.batch,
        optimizer=OptimizerConfig(lr=args.lr, weight_decay=1e-4), checkpoint_every=0,
        eval_every=args.eval_every, seed=seed, chunk_steps=args.chunk_steps, transient=revocations is not None,
        revocations=revocations or "none", replace="same", startup=str(args.startup_s), lr_policy=lr_policy,
    )
    col = _collector()
    callbacks = [col]
    if args.db:
        from cmdare.measure.recorder import StoreRecorder

        callbacks.append(StoreRecorder(args.db))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = Trainer(spec, callbacks, checkpoint_dir=tmp).run()
    if args.db:
        callbacks[-1].close()
    hist = dict(sorted(col.staleness.items()))
    n = sum(hist.values())
    mean_stale = sum(k * v for k, v in hist.items()) / n if n else 0.0
    return {
        "workers": workers, "seed": seed, "lr_policy": lr_policy, "revocations_spec": revocations,
        "final_accuracy": summary.final_accuracy, "global_step": summary.global_step, "status": summary.status,
        "revocations": summary.revocations, "replacements": summary.replacements,
        "staleness_hist": {str(k): v for k, v in hist.items()}, "staleness_mean": mean_stale,
        "staleness_p95": float(np.percentile(np.repeat(list(hist), list(hist.values())), 95)) if n else 0.0,
        "curve": col.curve, "lr_changes": [e for k, e in col.events if k == "lr_change"],
        "wall_s": time.perf_counter() - t0,
    }


def _mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and standard error."""
    a = np.asarray(values, float)
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else 0.0


def plot(results: dict, plot_dir: Path) -> list[str]:
    """Staleness distributions, final accuracy with error bars, accuracy curves, LR policies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    scale = results["scale"]
    counts = sorted({r["workers"] for r in scale})
    written = []
    if not scale:
        return written + _plot_policies(results, plot_dir, plt)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n in counts:
        hist: Counter = Counter()
        for r in (r for r in scale if r["workers"] == n):
            hist.update({int(k): v for k, v in r["staleness_hist"].items()})
        total = sum(hist.values())
        xs = [x for x in sorted(hist) if x <= 20]
        axes[0].plot(xs, [hist[x] / total for x in xs], "o-", ms=3, label=f"{n} workers")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("staleness (global steps since the pull; up to 20)")
    axes[0].set_ylabel("fraction of pushes")
    axes[0].set_title("push staleness, all seeds pooled")
    axes[0].legend()
    means = [_mean_ci([r["staleness_mean"] for r in scale if r["workers"] == n]) for n in counts]
    axes[1].errorbar(counts, [m for m, _ in means], yerr=[e for _, e in means], fmt="o-", capsize=4,
                     label="measured (mean +- s.e.)")
    axes[1].plot(counts, [n - 1 for n in counts], "k--", lw=1, label="n - 1 (proxy)")
    axes[1].set_xlabel("asynchronous workers")
    axes[1].set_ylabel("mean staleness")
    axes[1].legend()
    fig.tight_layout()
    path = plot_dir / "accuracy_staleness.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    accs = [_mean_ci([r["final_accuracy"] for r in scale if r["workers"] == n]) for n in counts]
    axes[0].errorbar(counts, [100 * m for m, _ in accs], yerr=[100 * e for _, e in accs], fmt="o-", capsize=4)
    for r in scale:
        axes[0].plot(r["workers"], 100 * r["final_accuracy"], ".", color="grey", alpha=0.6)
    axes[0].set_xlabel("asynchronous workers (equal total steps)")
    axes[0].set_ylabel("final test accuracy % (mean +- s.e.)")
    axes[0].set_title(f"digits, {results['args']['model']}, {results['args']['steps']} steps")
    for k, n in enumerate(counts):
        curves = [r["curve"] for r in scale if r["workers"] == n and r["curve"]]
        if curves:
            steps = [s for s, _ in curves[0]]
            m = min(len(c) for c in curves)
            acc = np.mean([[a for _, a in c[:m]] for c in curves], axis=0)
            axes[1].plot(steps[:m], 100 * acc, "o-", color=f"C{k}", label=f"{n} workers")
    axes[1].set_xlabel("global step")
    axes[1].set_ylabel("test accuracy % (mean over seeds)")
    axes[1].legend()
    fig.tight_layout()
    path = plot_dir / "accuracy_workers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))
    return written + _plot_policies(results, plot_dir, plt)


def _plot_policies(results: dict, plot_dir: Path, plt) -> list[str]:
    written = []
    if results.get("policies"):
        pol = results["policies"]
        names = list(dict.fromkeys(r["lr_policy"] for r in pol))
        fig, ax = plt.subplots(figsize=(5.5, 4))
        stats = [_mean_ci([r["final_accuracy"] for r in pol if r["lr_policy"] == p]) for p in names]
        ax.bar(names, [100 * m for m, _ in stats], yerr=[100 * e for _, e in stats], capsize=6,
               color=["C0", "C1", "C2", "C3"][: len(names)])
        for i, p in enumerate(names):
            ys = [100 * r["final_accuracy"] for r in pol if r["lr_policy"] == p]
            ax.plot([i] * len(ys), ys, "k.", alpha=0.6)
        lo = min(100 * r["final_accuracy"] for r in pol)
        ax.set_ylim(max(0, lo - 10), 100)
        ax.set_ylabel("final test accuracy % (mean +- s.e.)")
        ax.set_title(f"{results['args']['policy_workers']} workers, revocations {results['args']['revocations']}")
        fig.tight_layout()
        path = plot_dir / f"accuracy_lr_policy{results['args']['policy_plot_suffix']}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def fit_own(db: str) -> dict:
    """Fit the accuracy model on the runs recorded in ``db``, per workload; leave-one-run-out MAE next
    to the baseline that ignores workers and staleness."""
    from sklearn.base import clone

    from cmdare.measure.store.repository import open_store
    from cmdare.predict.accuracy import ACCURACY_COLUMNS, AccuracyModel, accuracy_model, own_accuracy_rows

    store = open_store(db)
    try:
        rows = own_accuracy_rows(store)
    finally:
        store.close()
    out = {}
    for workload, part in rows.groupby("workload"):
        X, y = part[list(ACCURACY_COLUMNS)].to_numpy(float), part["accuracy"].to_numpy(float)
        if len(y) < 4:
            continue
        errs = {}
        for name, est in (("model", AccuracyModel()), ("baseline", AccuracyModel(use_staleness=False))):
            pred = [clone(est).fit(np.delete(X, i, 0), np.delete(y, i)).predict(X[i : i + 1])[0] for i in range(len(y))]
            errs[name] = float(np.mean(np.abs(np.array(pred) - y)))
        model = accuracy_model(workload, db)
        out[workload] = {"runs": len(y), "loo_mae_model": round(errs["model"], 4),
                         "loo_mae_baseline": round(errs["baseline"], 4),
                         "params": {k: round(v, 5) for k, v in model.params_.items()}}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--chunk-steps", type=int, default=5)
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policy-workers", type=int, default=4)
    ap.add_argument("--policies", default="unchanged,linear")
    ap.add_argument("--revocations", default="every=4")
    ap.add_argument("--startup-s", type=float, default=2.0)
    ap.add_argument("--no-revocations", action="store_true", help="Skip the LR-policy experiment.")
    ap.add_argument("--no-scale", action="store_true", help="Skip the worker-count experiment.")
    ap.add_argument("--policy-plot-suffix", default="", help="Suffix of the LR-policy plot's file name.")
    ap.add_argument("--db", default=None, help="Also record every run in this store (SQLAlchemy URL).")
    ap.add_argument("--out", default="docs/images/accuracy_runs.json")
    ap.add_argument("--replot", action="store_true", help="Only redraw the plots from --out (no runs).")
    ap.add_argument("--plot-dir", default="docs/images")
    args = ap.parse_args(argv)
    if args.replot:
        results = json.loads(Path(args.out).read_text())
        results["args"].setdefault("policy_plot_suffix", args.policy_plot_suffix)
        written = plot(results, Path(args.plot_dir))
        own = fit_own(args.db) if args.db else {}
        print(json.dumps({"plots": written, "own_fit": own}))
        return {"plots": written, "own_fit": own}

    ray = start_local_ray(num_cpus=max(os.cpu_count() or 2, 12))
    t0 = time.perf_counter()
    results: dict = {"args": vars(args), "scale": [], "policies": []}
    try:
        for seed in range(0 if args.no_scale else args.seeds):
            for n in (int(x) for x in args.workers.split(",")):
                r = one_run(args, n, seed)
                results["scale"].append(r)
                print(f"workers={n} seed={seed} acc={r['final_accuracy']:.4f} stale={r['staleness_mean']:.2f} "
                      f"({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)
        if not args.no_revocations:
            for seed in range(args.seeds):
                for policy in args.policies.split(","):
                    r = one_run(args, args.policy_workers, seed, policy, args.revocations)
                    results["policies"].append(r)
                    print(f"policy={policy} seed={seed} acc={r['final_accuracy']:.4f} revocations="
                          f"{r['revocations']} lr_changes={len(r['lr_changes'])} ({r['wall_s']:.0f} s)",
                          file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    results["wall_s"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    plot(results, Path(args.plot_dir))
    summary: dict = {"wall_s": round(results["wall_s"], 1)}
    for n in sorted({r["workers"] for r in results["scale"]}):
        rs = [r for r in results["scale"] if r["workers"] == n]
        m, e = _mean_ci([r["final_accuracy"] for r in rs])
        summary[f"w{n}"] = {"acc_mean": round(m, 4), "acc_se": round(e, 4),
                            "staleness_mean": round(float(np.mean([r["staleness_mean"] for r in rs])), 3)}
    for p in dict.fromkeys(r["lr_policy"] for r in results["policies"]):
        rs = [r for r in results["policies"] if r["lr_policy"] == p]
        m, e = _mean_ci([r["final_accuracy"] for r in rs])
        summary[f"policy_{p}"] = {"acc_mean": round(m, 4), "acc_se": round(e, 4),
                                  "revocations_mean": float(np.mean([r["revocations"] for r in rs]))}
    if args.db:
        summary["own_fit"] = fit_own(args.db)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
