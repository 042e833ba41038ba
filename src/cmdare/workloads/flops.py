"""Forward FLOPs of one input, one multiply-add = 2 FLOPs.

Counted per module with forward hooks:

* ``Conv2d``: ``2 * (C_in / groups) * k_h * k_w`` per output element (+1 with a bias);
* ``Linear``: ``2 * in_features`` per output (+1 with a bias);
* batch normalisation: 2 per element (its folded scale and shift);
* recurrent layers (``LSTM``, ``GRU``, ``RNN``): per token, layer and direction ``2 * gates * hidden * (input +
  hidden)`` (4 gates for an LSTM, 3 for a GRU, 1 for a plain RNN), +``2 * gates * hidden`` with biases, +``2 *
  hidden * proj`` with an LSTM's projection;
* ``MultiheadAttention``: the query, key and value projections, the scores ``Q K^T`` and their weighted sum
  ``2 * 2 * L * S * E``, and the output projection.

Everything else (a matrix product or a convolution in a functional call, ``F.scaled_dot_product_attention``,
another module's arithmetic) is counted by :class:`torch.utils.flop_counter.FlopCounterMode` (with a formula for
the CPU kernel of attention it lacks), outside the modules above. An embedding is a lookup (no FLOPs);
activations, pooling, residual additions and element-wise gate functions are not counted (a few percent at most).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["count_forward"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def count_forward(model: nn.Module, x: Any) -> int:
    """Forward FLOPs of ``model`` on ``x`` (a batch of one sample: a meta or a real tensor, or whatever the
    model takes), run in eval mode without gradients; the model's mode is restored."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    total = 0
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_formulas())
    inside: list[int] = []  # the counter's total when the outermost counted module began (a stack of one)

    def counted(flops: Callable[..., int]) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(_mod: nn.Module, *_args: Any) -> None:
            inside.append(counter.get_total_flops())

        def post(mod: nn.Module, args: Any, *rest: Any) -> None:
            nonlocal total
            began = inside.pop()
            if not inside:  # the counter's figure for this module is replaced by ours
                total += flops(mod, args, *rest) - (counter.get_total_flops() - began)

        return pre, post

    handles = []
    for mod in model.modules():
        kind = _kind(mod, nn)
        if kind is None:
            continue
        pre, post = counted(kind)
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, with_kwargs=kind is _attention))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), counter:
            model(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return int(total + counter.get_total_flops())


def _cpu_formulas() -> dict[Any, Callable[..., int]]:
    """Formulas of operations torch's counter does not know: the CPU kernel of ``F.scaled_dot_product_attention``
    (counted on the meta device, where it decomposes into matrix products, but not on a real CPU sample)."""
    import torch

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return {} if op is None else {op: _sdpa}


def _sdpa(query_shape: Any, key_shape: Any, value_shape: Any, *_args: Any, out_shape: Any = None, **_kw: Any) -> int:
    """``Q K^T`` and the weighted sum of ``V``: ``2 * L * S * (E + E_v)`` per batch and head."""
    batch = 1
    for size in query_shape[:-2]:
        batch *= size
    q_len, e = query_shape[-2], query_shape[-1]
    return 2 * batch * q_len * key_shape[-2] * (e + value_shape[-1])


def _kind(mod: nn.Module, nn: Any) -> Callable[..., int] | None:
    if isinstance(mod, nn.Conv2d):
        return _conv
    if isinstance(mod, nn.Linear):
        return _linear
    if isinstance(mod, nn.modules.batchnorm._BatchNorm):
        return _norm
    if isinstance(mod, nn.RNNBase) and mod.mode in _GATES:
        return _recurrent
    if isinstance(mod, nn.MultiheadAttention):
        return _attention
    return None


def _conv(mod: nn.Conv2d, _args: Any, out: torch.Tensor) -> int:
    k = mod.kernel_size[0] * mod.kernel_size[1] * (mod.in_channels // mod.groups)
    return out.numel() * (2 * k + (1 if mod.bias is not None else 0))


def _linear(mod: nn.Linear, _args: Any, out: torch.Tensor) -> int:
    return out.numel() * (2 * mod.in_features + (1 if mod.bias is not None else 0))


def _norm(_mod: nn.Module, _args: Any, out: torch.Tensor) -> int:
    return 2 * out.numel()


def _recurrent(mod: nn.RNNBase, args: Any, _out: Any) -> int:
    from torch.nn.utils.rnn import PackedSequence

    x = args[0]
    tokens = x.data.shape[0] if isinstance(x, PackedSequence) else x.shape[0] * (x.shape[1] if x.dim() == 3 else 1)
    gates, hidden, directions = _GATES[mod.mode], mod.hidden_size, 2 if mod.bidirectional else 1
    out_size = mod.proj_size or hidden
    per_token = 0
    for layer in range(mod.num_layers):
        inputs = mod.input_size if layer == 0 else out_size * directions
        one = 2 * gates * hidden * (inputs + out_size) + (2 * gates * hidden if mod.bias else 0)
        one += 2 * hidden * mod.proj_size if mod.proj_size else 0
        per_token += one * directions
    return tokens * per_token


def _attention(mod: nn.MultiheadAttention, args: Any, kwargs: dict[str, Any], _out: Any) -> int:
    query = args[0] if args else kwargs["query"]
    key = args[1] if len(args) > 1 else kwargs.get("key", query)
    e = mod.embed_dim
    if query.dim() == 3:
        batch = query.shape[0] if mod.batch_first else query.shape[1]
        q_len, k_len = (query.shape[1], key.shape[1]) if mod.batch_first else (query.shape[0], key.shape[0])
    else:  # one unbatched sequence
        batch, q_len, k_len = 1, query.shape[0], key.shape[0]
    bias = 1 if mod.in_proj_bias is not None else 0
    projections = q_len * e * (2 * e + bias) + k_len * e * (2 * mod.kdim + bias) + k_len * e * (2 * mod.vdim + bias)
    scores = 2 * 2 * q_len * k_len * e
    out = q_len * e * (2 * e + (1 if mod.out_proj.bias is not None else 0))
    return batch * (projections + scores + out)
