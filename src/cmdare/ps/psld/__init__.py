"""PSLD: elastic parameter-server load distribution (Chen et al., SoCC 2020), as a testable policy.

- :mod:`~cmdare.ps.psld.load`: what shards measure (:class:`ShardLoad`) and per-byte/per-block costs.
- :mod:`~cmdare.ps.psld.detector`: slow shard vs heavy placement.
- :mod:`~cmdare.ps.psld.cost_model`: online per-shard cost model with uncertainty.
- :mod:`~cmdare.ps.psld.search`: UCB-greedy planning of block moves, drain plans.
- :mod:`~cmdare.ps.psld.decisions`: ``Move``/``AddShard``/``RemoveShard``/``NoChange`` and applying them.
- :mod:`~cmdare.ps.psld.balancer`: :class:`PsldBalancer`, the policy the controller calls.
- :mod:`~cmdare.ps.psld.simulate`: a pure-Python load simulator for tests and quick experiments.
"""

from cmdare.ps.psld.balancer import PsldBalancer
from cmdare.ps.psld.cost_model import CostModel
from cmdare.ps.psld.decisions import AddShard, Decision, Move, NoChange, RemoveShard, apply_decisions, moved_bytes
from cmdare.ps.psld.detector import ShardDiagnosis, ShardState, diagnose
from cmdare.ps.psld.load import BlockLoad, ShardCost, ShardLoad, block_costs, shard_costs
from cmdare.ps.psld.search import Plan, plan_drain, plan_rebalance, predict_after

__all__ = [
    "AddShard",
    "BlockLoad",
    "CostModel",
    "Decision",
    "Move",
    "NoChange",
    "Plan",
    "PsldBalancer",
    "RemoveShard",
    "ShardCost",
    "ShardDiagnosis",
    "ShardLoad",
    "ShardState",
    "apply_decisions",
    "block_costs",
    "diagnose",
    "moved_bytes",
    "plan_drain",
    "plan_rebalance",
    "predict_after",
    "shard_costs",
]
