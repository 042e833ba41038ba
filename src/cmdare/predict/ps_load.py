"""Load of each parameter server under a placement strategy, for the cluster-speed model.

A placement of ``cmdare.ps`` (``round-robin``: TensorFlow's default, as in CM-DARE's runs;
``greedy``, ``mxnet``, ``byteps``) applied to the workload's tensor list gives each PS its bytes and
its number of blocks (each block is one push and one pull per step). ``psld`` stands for the
balanced load PSLD's live balancer converges towards: every PS holds ``1/p`` of the bytes and of
the tensors. The busiest PS sets the cluster's capacity.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["BALANCED", "PLACEMENT_NAMES", "ps_loads"]

BALANCED = "psld"
PLACEMENT_NAMES = ("round-robin", "greedy", "mxnet", "byteps", BALANCED)


@lru_cache(maxsize=4096)
def ps_loads(
    num_params: float, num_tensors: float, ps: int, placement: str = "round-robin"
) -> tuple[tuple[float, float], ...]:
    """``((parameters, blocks), ...)`` held by each of the ``ps`` parameter servers.

    Raises:
        UnknownNameError: for a placement not in :data:`PLACEMENT_NAMES`.
    """
    from cmdare.errors import UnknownNameError

    ps = max(int(ps), 1)
    if placement not in PLACEMENT_NAMES:
        raise UnknownNameError("placement", placement, list(PLACEMENT_NAMES))
    if placement == BALANCED or ps == 1:
        return tuple((float(num_params) / ps, float(num_tensors) / ps) for _ in range(ps))
    from cmdare.predict.op_profile import tensor_list_for
    from cmdare.ps.blocks import ParamInfo
    from cmdare.ps.placement import get_placement

    params = [ParamInfo(i, name, shape) for i, (name, shape) in enumerate(tensor_list_for(num_params, num_tensors))]
    placed = get_placement(placement).place(params, ps)
    elems = [0.0] * ps
    blocks = [0.0] * ps
    for block, shard in zip(placed.blocks, placed.shard_of, strict=True):
        elems[shard] += block.size
        blocks[shard] += 1
    return tuple(zip(elems, blocks, strict=True))
