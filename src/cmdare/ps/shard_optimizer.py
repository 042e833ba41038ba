"""Any ``torch.optim`` optimizer on a parameter shard's blocks (``--optimizer adamw`` with a parameter server).

SGD with momentum keeps its fast path (:func:`cmdare.ps.optimizer.sgd_update`: the momentum buffer beside the
parameters, chunked, pieces applied on arrival). Every other optimizer runs as the ``torch.optim`` class itself,
with each block of the shard one parameter tensor of it (a view of the shard's flat buffer), so an elementwise
optimizer (AdamW, Adam, RMSprop, Adagrad, ...) computes what it computes on the model, and with whole-parameter
blocks (the default) any other one does too. Its state stays in the shard, in the shard's order:

* per-element state (AdamW's ``exp_avg`` and ``exp_avg_sq``): flat arrays beside the parameters;
* per-block scalars (AdamW's ``step``): one value per block;
* whether each block has state yet: the optimizer makes a block's state at the block's first update.

:class:`OptimizerSlots` is that state; moves, evacuations, snapshots and restores carry it with the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from cmdare.errors import UserInputError

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from cmdare.ps.optimizer_config import OptimizerConfig

__all__ = ["HAS_STATE_KEY", "OptimizerSlots", "ShardOptimizer", "gather_elements", "shard_optimizer"]

HAS_STATE_KEY = "__has_state__"  # a checkpoint's optimizer arrays: one flag per parameter, it has state


def gather_elements(array: np.ndarray, picks: list[tuple[int, tuple[int, int]]]) -> np.ndarray:
    """The element ranges of ``picks`` (``(block index, (start, end))``) of ``array``, concatenated (float32)."""
    if not picks:
        return np.zeros(0, np.float32)
    return np.concatenate([array[a:b] for _, (a, b) in picks]).astype(np.float32, copy=False)


@dataclass(frozen=True)
class OptimizerSlots:
    """An optimizer's state for a shard's blocks, in the shard's order."""

    elements: dict[str, np.ndarray]  # name -> float32, one value per element (parallel to the parameters)
    scalars: dict[str, np.ndarray]  # name -> float64, one value per block
    has_state: np.ndarray  # bool, one per block: the optimizer made the block's state (at its first update)

    def copy(self) -> OptimizerSlots:
        return OptimizerSlots({k: v.copy() for k, v in self.elements.items()},
                              {k: v.copy() for k, v in self.scalars.items()}, self.has_state.copy())

    def gather(self, picks: list[tuple[int, tuple[int, int]]]) -> OptimizerSlots:
        """The state of the picked blocks (``(block index, (start, end))``), in the order picked."""
        index = np.array([i for i, _ in picks], dtype=np.int64)
        return OptimizerSlots({k: gather_elements(v, picks) for k, v in self.elements.items()},
                              {k: v[index].astype(np.float64) for k, v in self.scalars.items()},
                              self.has_state[index].astype(bool))

    def concat(self, other: OptimizerSlots) -> OptimizerSlots:
        """This shard's blocks' state, then ``other``'s."""
        if set(self.elements) != set(other.elements) or set(self.scalars) != set(other.scalars):
            raise ValueError("blocks of two optimizers cannot share a shard")
        return OptimizerSlots({k: np.concatenate([v, other.elements[k]]) for k, v in self.elements.items()},
                              {k: np.concatenate([v, other.scalars[k]]) for k, v in self.scalars.items()},
                              np.concatenate([self.has_state, other.has_state]))

    def check(self, num_elems: int, num_blocks: int) -> None:
        """Raise ValueError unless the state covers ``num_elems`` elements in ``num_blocks`` blocks."""
        if any(v.size != num_elems for v in self.elements.values()) or self.has_state.size != num_blocks or \
                any(v.size != num_blocks for v in self.scalars.values()):
            raise ValueError(f"optimizer state for other blocks than the shard's {num_blocks} ({num_elems} values)")

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.elements.values()) + sum(v.nbytes for v in self.scalars.values())


class ShardOptimizer:
    """A ``torch.optim`` class (by :func:`~cmdare.ps.torch_optimizer.build_optimizer`'s name) applied to a shard's
    blocks, its state kept in :class:`OptimizerSlots`."""

    def __init__(self, name: str, cfg: OptimizerConfig):
        from cmdare.ps.torch_optimizer import optimizer_factory

        self.name, self.cfg = name, cfg
        self._build = optimizer_factory(name, cfg)  # the class resolved once: built anew on every push
        self.element_keys, self.scalar_dtypes, cls = _state_layout(name, self._build)
        #: Updates each element from its own values alone: the shard's blocks may step as one tensor (faster, and
        #: the same values) while their state is alike.
        self.elementwise = cls.__module__.startswith("torch.optim") and cls.__name__ in _ELEMENTWISE

    def empty(self, num_elems: int, num_blocks: int) -> OptimizerSlots:
        """State for blocks the optimizer has not updated yet."""
        return OptimizerSlots({k: np.zeros(num_elems, np.float32) for k in self.element_keys},
                              {k: np.zeros(num_blocks, np.float64) for k in self.scalar_dtypes},
                              np.zeros(num_blocks, dtype=bool))

    def update(self, params: np.ndarray, grad: np.ndarray, state: OptimizerSlots, spans: list[tuple[int, int]],
               lr: float) -> None:
        """One step of the optimizer, in place, on ``params`` (blocks at ``spans``) with ``grad`` at ``lr``."""
        import torch

        from cmdare.ps.optimizer import shared_tensor

        if not spans:  # a shard left without blocks (they all moved away)
            return
        # parameter tensors of the step: each block, or (elementwise, state alike) the whole buffer as one
        groups = [((spans[0][0], spans[-1][1]), list(range(len(spans))))] if self.elementwise and _alike(state) \
            else [(span, [i]) for i, span in enumerate(spans)]
        tensors = [torch.from_numpy(params[a:b]) for (a, b), _ in groups]
        optimizer = self._build(tensors)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for t, ((a, b), blocks) in zip(tensors, groups, strict=True):
            t.grad = shared_tensor(grad[a:b])  # read-only from Ray: never written
            if state.has_state[blocks[0]]:
                held: dict[str, object] = {k: torch.from_numpy(state.elements[k][a:b]) for k in self.element_keys}
                for k, dtype in self.scalar_dtypes.items():
                    value = float(state.scalars[k][blocks[0]])
                    held[k] = value if dtype is None else torch.tensor(value, dtype=dtype)
                optimizer.state[t] = held
        optimizer.step()
        for t, ((a, b), blocks) in zip(tensors, groups, strict=True):
            made = optimizer.state.get(t)
            if not made:
                continue
            for k in self.element_keys:
                view = state.elements[k][a:b]
                if made[k].data_ptr() != view.ctypes.data:  # made at this first update, or replaced
                    view[...] = made[k].detach().reshape(-1).numpy()
            for k in self.scalar_dtypes:
                state.scalars[k][blocks] = float(made[k])
            state.has_state[blocks] = True


@lru_cache(maxsize=8)
def shard_optimizer(name: str, cfg: OptimizerConfig) -> ShardOptimizer | None:
    """The shards' optimizer for ``--optimizer name``: None for ``sgd`` (the momentum fast path). Made once per
    process for a name and configuration (its probe step, its class's import): it holds no state of its own.

    Raises:
        UserInputError: an unknown name, or an optimizer whose state a shard cannot hold.
    """
    return None if name == "sgd" else ShardOptimizer(name, cfg)


#: torch.optim classes whose update of an element reads only that element's values (and per-tensor scalars that
#: depend on the step alone): stepping a shard's blocks as one tensor gives each element what stepping its own
#: parameter tensor gives it (tests/ps/test_shard_optimizer.py checks AdamW, Adagrad and RMSprop exactly).
_ELEMENTWISE = frozenset({"SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "NAdam", "RAdam",
                          "Rprop", "ASGD"})


def _alike(state: OptimizerSlots) -> bool:
    """Whether every block has state, or none has, with the same scalars (the step): they can step as one."""
    has = state.has_state
    return bool(has.all() or not has.any()) and all(bool((v == v[0]).all()) for v in state.scalars.values())


def _state_layout(name: str, build: Callable[[list[torch.Tensor]], torch.optim.Optimizer]
                  ) -> tuple[tuple[str, ...], dict[str, torch.dtype | None], type]:
    """The optimizer's per-element state names, its per-parameter scalars' dtypes and its class, from one step on
    a probe (``build``: the optimizer named ``name`` over the given tensors)."""
    import torch

    probe = torch.zeros(3)
    probe.grad = torch.zeros(3)
    optimizer = build([probe])
    try:
        optimizer.step()
    except Exception as err:  # noqa: BLE001 - the user's optimizer class: any failure is theirs to read
        raise UserInputError(f"--optimizer {name} cannot step on a parameter shard's block "
                             f"({type(err).__name__}: {err})") from None
    elements, scalars = [], {}
    for key, value in sorted(optimizer.state.get(probe, {}).items()):
        if torch.is_tensor(value) and value.shape == probe.shape:
            elements.append(key)
        elif torch.is_tensor(value) and value.numel() == 1:
            scalars[key] = value.dtype
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[key] = None  # a Python number
        else:
            raise UserInputError(f"--optimizer {name} keeps state {key!r} ({type(value).__name__}) that a parameter "
                                 "shard cannot hold; train it with --topology allreduce")
    return tuple(elements), scalars, type(optimizer)

