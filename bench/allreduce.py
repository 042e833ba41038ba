"""Elastic all-reduce (issue 44): cmdare's members against plain PyTorch DDP, and what a lost member costs.

* ``overhead_vs_ddp``: steps/s of 2 cmdare all-reduce members (Ray actors, :class:`Replica`: gradient buckets
  launched during backward over an elastic gloo group) over steps/s of plain DDP (gloo, 2 spawned processes,
  ``init_method=tcp://127.0.0.1``), same model, batch, data and one thread each; interleaved rounds, medians.
* ``recovery_s``: 3 members train; one is killed (SIGKILL) in the middle of a chunk; from the kill to the next
  step completed by the survivors at size 2 (the failed collective, the re-formation at a new epoch, the heal
  that makes the survivors agree, one step). Median of ``--trials``.
* ``heal_s``: a replacement's process is up and its model built (its ``ping``); from then to its first step
  completed in the group of 3 (formation, the whole state copied from a peer, one step).

* ``overhead_vs_ddp_train``: the same, through the whole ``cmdare train --topology allreduce`` (the
  :class:`~cmdare.train.trainer.Trainer`: 2 workers, no revocations, ``--train-steps`` steps, the controller, the
  driver's lockstep chunks, the store's reports) over the same DDP rate; beside it ``batches_per_s_train_ps``,
  the asynchronous PS run of the same workers (each step one batch; an all-reduce step is one per member).

* ``goodput_{allreduce,restart}_{60s,15s}``: useful batches/s of 3 members with one member killed every 60 s
  (a 120 s run) and every 15 s (a 60 s run), over the same loop without revocations. ``allreduce``: the survivors
  re-form and heal at once, a replacement is started at the kill and joins (healed from a peer) when its process
  is up. ``restart``, as Ray Train v2 and SkyPilot recover: the whole group is stopped, a new group started, and
  every member loads the newest checkpoint (the steps since are lost). Both store a checkpoint every
  ``--checkpoint-every`` steps from member 0.

``restart_s`` and ``restart_lost_steps``: what one restart cost there (medians): the group stopped, started and
reloaded, and the steps since the newest checkpoint.

* ``goodput_ps_{60s,15s}`` and ``goodput_allreduce_train_{60s,15s}``: the same question through whole ``cmdare
  train`` runs of 3 workers, PS and all-reduce (the controller, the drivers, the store): useful batches/s with a
  worker revoked every 60 s and 15 s of training over the same run without revocations. The trainer's
  revocations are emulated in cloud time, which advances with training; ``step=`` is calibrated from the
  revocation-free run so that a cloud second is a second of it, and ``--startup 0``: a replacement joins once its
  real process is up, as above. ``revocations_*`` counts the revocations each run had.

Everything is measured in this run on this machine.

Usage: .venv/bin/python bench/allreduce.py [--model resnet8] [--batch 32] [--steps 40] [--rounds 3] [--trials 10]
                                          [--goodput 60,15] [--checkpoint-every 100] [--train-steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import tempfile
import time

from cmdare.train.run.ray_session import start_local_ray  # before Ray is imported: Ray on 127.0.0.1


def _ddp_member(rank: int, port: int, args: argparse.Namespace, out: object) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from cmdare.datasets import GroupBatches, load_dataset
    from cmdare.workloads import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    data = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(args.model, num_classes=data.num_classes,
                                                in_channels=data.input_shape[0]))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = GroupBatches((data.train_x, data.train_y), args.batch, 0)
    batches.regroup(rank, 2)

    def steps(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = next(batches)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        dist.barrier()
        return time.perf_counter() - t0

    steps(5)
    for _ in range(args.rounds):
        dist.barrier()
        took = steps(args.steps)
        if rank == 0:
            out.put(args.steps / took)  # type: ignore[attr-defined]
        dist.barrier()
    dist.destroy_process_group()


def _pid(ray, actor) -> int:
    """The process ID of ``actor`` (a member this bench started, killed by its PID)."""
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid())))


CHUNK = 5  # steps per call between the goodput loop's checks (a kill due, a newcomer up, a checkpoint)


def _goodput_run(ray, start, form, n: int, duration_s: float, interval_s: float | None, mode: str,
                 checkpoint: str, checkpoint_every: int, restarts: list | None = None) -> float:
    """Useful batches/s of ``n`` members over ``duration_s`` with a member killed every ``interval_s``
    (``restarts``: gets ``(seconds, steps lost)`` of each restart in ``restart`` mode)."""
    members = start(n)
    ray.get([m.ping.remote() for m in members])
    form(members)
    step = batches = 0
    stored = (0, 0)  # (step, batches) of the newest checkpoint
    newcomers: list = []  # (actor, its ping) of replacements starting
    rng = random.Random(0)
    t0 = time.perf_counter()
    next_kill = t0 + interval_s if interval_s else float("inf")
    while time.perf_counter() < t0 + duration_s:
        if time.perf_counter() >= next_kill:
            next_kill += interval_s or 0.0
            victim = members.pop(rng.randrange(len(members)))
            os.kill(_pid(ray, victim), signal.SIGKILL)
            if mode == "restart":  # stop the group, start a new one, reload the newest checkpoint
                t_restart = time.perf_counter()
                for m in members:
                    ray.kill(m)
                members = start(n)
                ray.get([m.ping.remote() for m in members])
                if stored[0]:
                    ray.get([m.load.remote(checkpoint) for m in members])
                form(members)
                if restarts is not None:
                    restarts.append((time.perf_counter() - t_restart, step - stored[0]))
                step, batches = stored
            else:  # the survivors' next collective fails: re-form, heal from the furthest, ask for a replacement
                lost = ray.get([m.run_steps.remote(1) for m in members])
                root = max(range(len(members)), key=lambda i: lost[i].step)
                form(members)
                ray.get([m.heal.remote(root) for m in members])
                step = lost[root].step
                actor = start(1)[0]
                newcomers.append((actor, actor.ping.remote()))
            continue
        ready = [(a, ref) for a, ref in newcomers if ray.wait([ref], timeout=0)[0]]
        if ready:
            for item in ready:
                newcomers.remove(item)
                members.append(item[0])
            form(members)  # member 0 is of the old group: every newcomer takes its state
            ray.get([m.heal.remote(0) for m in members])
        chunks = ray.get([m.run_steps.remote(CHUNK) for m in members])
        done = min(c.steps for c in chunks)
        step += done
        batches += done * len(members)
        if step // checkpoint_every > stored[0] // checkpoint_every:
            ray.get(members[0].save.remote(checkpoint))
            stored = (step, batches)
    elapsed = time.perf_counter() - t0
    for m in members + [a for a, _ in newcomers]:
        ray.kill(m)
    return batches / elapsed


def _train_rates(args: argparse.Namespace) -> dict[str, float]:
    """Steps/s of whole ``cmdare train`` runs of 2 workers without revocations (the Trainer on the Ray already
    started): ``allreduce`` (group steps) and ``ps`` (asynchronous pushes)."""
    from cmdare.ps.optimizer_config import OptimizerConfig
    from cmdare.train import TrainSpec
    from cmdare.train.trainer import Trainer

    rates = {}
    for topology in ("allreduce", "ps"):
        spec = TrainSpec(model=args.model, dataset="digits", workers=2, steps=args.train_steps, batch_size=args.batch,
                         seed=0, topology=topology, transient=False, checkpoint_every=0, eval_every=0,
                         optimizer=OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=0.0))
        with tempfile.TemporaryDirectory() as tmp:
            summary = Trainer(spec, checkpoint_dir=tmp).run()
        rates[topology] = summary.steps_per_s
    return rates


def _trainer_goodput(args: argparse.Namespace, intervals: list[int], n: int = 3) -> dict[str, float | None]:
    """Goodput through whole ``cmdare train`` runs of ``n`` workers, PS and all-reduce: useful batches/s with a
    worker revoked every ``interval`` s of training, over the same run without revocations.

    The trainer's revocations are emulated in cloud time, which advances with training
    (:mod:`cmdare.control.emulated_clock`); ``step=`` is set from the revocation-free run's measured rate so
    that a cloud second is a second of that run, and ``--startup 0``: a replacement joins when its real process
    is up, as in the member loop above. Each run trains ``max(2 * interval, 60)`` s worth of steps."""
    from cmdare.events import TrainCallback
    from cmdare.ps.optimizer_config import OptimizerConfig
    from cmdare.train import TrainSpec
    from cmdare.train.trainer import Trainer

    class Events(TrainCallback):
        def __init__(self) -> None:
            self.kinds: list[str] = []

        def on_event(self, report) -> None:  # noqa: ANN001
            self.kinds.append(report.kind)

    def run(topology: str, steps: int, revocations: str) -> tuple[float, int, int]:
        spec = TrainSpec(model=args.model, dataset="digits", workers=n, steps=steps, batch_size=args.batch, seed=0,
                         topology=topology, transient=revocations != "none", revocations=revocations, startup="0",
                         checkpoint_every=args.checkpoint_every, eval_every=0,
                         optimizer=OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=0.0))
        events = Events()
        with tempfile.TemporaryDirectory() as tmp:
            summary = Trainer(spec, checkpoint_dir=tmp, callbacks=[events]).run()
        assert summary.status == "finished", summary
        per_step = 1 if topology == "ps" else n  # batches per global step (an all-reduce step: one per member)
        return summary.steps_per_s * per_step, events.kinds.count("revocation"), events.kinds.count("regroup")

    out: dict[str, float | None] = {}
    for topology in ("ps", "allreduce"):
        per_step = 1 if topology == "ps" else n
        probe, _, _ = run(topology, 2000 // per_step, "none")
        free, _, _ = run(topology, int(30 * probe / per_step), "none")  # about 30 s
        out[f"batches_per_s_free_train_{topology}"] = round(free, 2)
        step_s = n / free  # cloud seconds of a worker step: n workers' steps make one second of this run
        key = "ps" if topology == "ps" else "allreduce_train"
        for interval in intervals:
            duration = max(2.0 * interval, 60.0)
            rate, revoked, _ = run(topology, int(duration * free / per_step), f"every={interval},step={step_s:.6g}")
            out[f"goodput_{key}_{interval}s"] = round(rate / free, 3)
            out[f"revocations_{key}_{interval}s"] = revoked
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--goodput", default="60,15", help="seconds between kills, comma-separated ('': skip)")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--train-steps", type=int, default=600, help="steps of each cmdare train run (0: skip)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    ray = start_local_ray(num_cpus=8)

    import torch.multiprocessing as mp

    from cmdare.collective import Rendezvous
    from cmdare.ps.optimizer_config import OptimizerConfig
    from cmdare.train import TrainSpec
    from cmdare.train.allreduce.replica import Replica

    spec = TrainSpec(model=args.model, dataset="digits", workers=1, steps=10**6, batch_size=args.batch, seed=0,
                     optimizer=OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=0.0))
    rendezvous = Rendezvous()
    actor = ray.remote(num_cpus=1)(Replica)
    epoch = 0

    def start(n: int) -> list:
        return [actor.remote(spec, rendezvous.address, threads=1, member_seed=i) for i in range(n)]

    def form(members: list) -> None:
        nonlocal epoch
        epoch += 1
        assert all(ray.get([m.form.remote(epoch, r, len(members)) for r, m in enumerate(members)]))

    # -- steady-state overhead against DDP, interleaved rounds ------------------------------------------
    pair = start(2)
    form(pair)
    ray.get([m.run_steps.remote(5) for m in pair])
    ctx = mp.get_context("spawn")
    cmdare_rates, ddp_rates = [], []
    for _ in range(args.rounds):
        chunks = ray.get([m.run_steps.remote(args.steps) for m in pair])
        cmdare_rates.append(args.steps / max(c.duration_s for c in chunks))
        out = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_ddp_member, args=(r, port, argparse.Namespace(**{**vars(args), "rounds": 1}),
                                                       out)) for r in range(2)]
        for p in procs:
            p.start()
        ddp_rates.append(out.get(timeout=600))
        for p in procs:
            p.join(timeout=60)
    for m in pair:
        ray.kill(m)
    trained = _train_rates(args) if args.train_steps else {}

    # -- recovery after a kill, and a replacement's heal -----------------------------------------------
    members = start(3)
    form(members)
    ray.get([m.run_steps.remote(3) for m in members])
    recovery, heal = [], []
    for _ in range(args.trials):
        victim = members.pop()
        pid = _pid(ray, victim)
        running = [m.run_steps.remote(10**6) for m in members]
        victim.run_steps.remote(10**6)
        time.sleep(0.5)
        t_kill = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        lost = ray.get(running)
        assert all(c.lost for c in lost), lost
        root = max(range(len(members)), key=lambda i: lost[i].step)
        form(members)
        assert all(ray.get([m.heal.remote(root) for m in members]))
        ray.get([m.run_steps.remote(1) for m in members])
        recovery.append(time.perf_counter() - t_kill)
        newcomer = start(1)[0]
        ready_at = ray.get(newcomer.ping.remote())
        members.append(newcomer)
        form(members)
        assert all(ray.get([m.heal.remote(0) for m in members]))
        ray.get([m.run_steps.remote(1) for m in members])
        heal.append(time.time() - ready_at)
    for m in members:
        ray.kill(m)

    # -- goodput: kills every 60 s and 15 s, survivors re-forming vs the group restarted ----------------
    goodput: dict[str, float | None] = {f"goodput_{t}_{p}s": None for t in ("allreduce", "ps", "restart")
                                        for p in (60, 15)}
    intervals = [int(x) for x in args.goodput.split(",") if x.strip()]
    if intervals:
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = os.path.join(tmp, "state.pt")
            free = _goodput_run(ray, start, form, 3, 30.0, None, "allreduce", checkpoint, args.checkpoint_every)
            goodput["batches_per_s_free"] = round(free, 2)
            restarts: list[tuple[float, int]] = []
            for interval in intervals:
                for mode in ("allreduce", "restart"):
                    duration = max(2.0 * interval, 60.0)  # 60 s: one kill in 120 s; 15 s: three in 60 s
                    rate = _goodput_run(ray, start, form, 3, duration, interval, mode, checkpoint,
                                        args.checkpoint_every, restarts)
                    goodput[f"goodput_{mode}_{interval}s"] = round(rate / free, 3)
            if restarts:  # a restart: the group stopped, started, reloaded; the steps since the checkpoint
                goodput["restart_s"] = round(statistics.median(s for s, _ in restarts), 3)
                goodput["restart_lost_steps"] = statistics.median(lost for _, lost in restarts)
        goodput.update(_trainer_goodput(args, intervals))
    rendezvous.close()
    ray.shutdown()

    result = {
        "overhead_vs_ddp": round(statistics.median(cmdare_rates) / statistics.median(ddp_rates), 3),
        "steps_per_s_cmdare": round(statistics.median(cmdare_rates), 2),
        "steps_per_s_ddp": round(statistics.median(ddp_rates), 2),
        "spread_cmdare": [round(min(cmdare_rates), 2), round(max(cmdare_rates), 2)],
        "spread_ddp": [round(min(ddp_rates), 2), round(max(ddp_rates), 2)],
        "overhead_vs_ddp_train": round(trained["allreduce"] / statistics.median(ddp_rates), 3) if trained else None,
        "batches_per_s_train_allreduce": round(2 * trained["allreduce"], 2) if trained else None,
        "batches_per_s_train_ps": round(trained["ps"], 2) if trained else None,
        "recovery_s": round(statistics.median(recovery), 3),
        "recovery_s_spread": [round(min(recovery), 3), round(max(recovery), 3)],
        "heal_s": round(statistics.median(heal), 3),
        "heal_s_spread": [round(min(heal), 3), round(max(heal), 3)],
        **goodput, "checkpoint_every": args.checkpoint_every,
        "model": args.model, "batch": args.batch, "trials": args.trials,
        "loadavg_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
