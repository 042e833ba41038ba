"""What ``--optimizer adamw`` costs a parameter shard: one push's update, AdamW against SGD with momentum.

One :class:`~cmdare.ps.shard_state.ShardState` holding a model's blocks (whole parameter tensors, as the default
placement cuts them) applies the same gradients with each optimizer, interleaved in rounds on one thread (a shard
actor's). SGD is the shards' own chunked update; AdamW is ``torch.optim.AdamW`` on the blocks
(:mod:`cmdare.ps.shard_optimizer`: the shard's blocks stepped as one tensor while their state is alike). Keys:
``sgd_update_ms``, ``adamw_update_ms`` (medians of the rounds), ``adamw_over_sgd``,
``adamw_per_block_update_ms`` (each block its own tensor, as for an optimizer that is not elementwise), and the
bytes of optimizer state each shard holds per parameter.

Usage: .venv/bin/python bench/shard_optimizer.py [--model resnet32] [--rounds 5] [--pushes 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from cmdare.ps.blocks import param_infos
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.ps.placement import RoundRobin
from cmdare.ps.shard_state import BlockData, ShardState
from cmdare.workloads import build_model


def _shard(model: torch.nn.Module, optimizer: str) -> ShardState:
    infos = param_infos((n, p.shape) for n, p in model.named_parameters())
    placement = RoundRobin().place(infos, 1)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    state = ShardState(0, OptimizerConfig(lr=1e-3, weight_decay=1e-2), optimizer=optimizer)
    state.load(BlockData(tuple(placement.blocks_on(0)), params, np.zeros_like(params), 0))
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pushes", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build_model(args.model, num_classes=10, in_channels=3)
    shards = {name: _shard(model, name) for name in ("sgd", "adamw")}
    shards["adamw_per_block"] = _shard(model, "adamw")
    shards["adamw_per_block"].optimizer.elementwise = False
    n = shards["sgd"].params.size
    grads = [np.random.default_rng(i).standard_normal(n).astype(np.float32) * 1e-3 for i in range(args.pushes)]
    times: dict[str, list[float]] = {name: [] for name in shards}
    for _ in range(args.rounds):
        for name, shard in shards.items():
            t0 = time.perf_counter()
            for g in grads:
                shard.apply(g)
            times[name].append((time.perf_counter() - t0) / len(grads) * 1e3)
    sgd, adamw = statistics.median(times["sgd"]), statistics.median(times["adamw"])
    per_block = statistics.median(times["adamw_per_block"])
    same = bool(np.array_equal(shards["adamw"].params, shards["adamw_per_block"].params))
    state = shards["adamw"].slots
    print(f"{args.model}: {n} parameters in {len(shards['sgd'].blocks)} blocks; one push's update: SGD "
          f"{sgd:.2f} ms, AdamW {adamw:.2f} ms (block by block {per_block:.2f} ms; the same values: {same})")
    print(json.dumps({"model": args.model, "params": n, "blocks": len(shards["sgd"].blocks),
                      "sgd_update_ms": round(sgd, 3), "adamw_update_ms": round(adamw, 3),
                      "adamw_over_sgd": round(adamw / sgd, 2), "adamw_per_block_update_ms": round(per_block, 3),
                      "per_block_values_equal": same,
                      "state_bytes_per_param_sgd": 4, "state_bytes_per_param_adamw":
                          round((state.nbytes + shards["adamw"].momentum.nbytes) / n, 2)}))


if __name__ == "__main__":
    main()
