"""Gradients averaged over an elastic group in buckets launched during backward, as DDP does.

Parameters are cut into buckets of about ``cap_bytes`` in reverse order (the order backward produces their
gradients). When the last gradient of a bucket is accumulated, the bucket is flattened and its all-reduce
starts, so the collective of the last layers runs while backward computes the first. :meth:`finish` waits,
divides by the group's size and writes the averages back into ``.grad``. A parameter that got no gradient this
step counts as zeros. In a group of one nothing is copied: the gradients stay as backward left them.

With a ``weight`` each member's gradient is multiplied by it and the group's sum is the result: members whose
batches differ in size weigh them by their share of the global batch, so the sum is the global batch's mean
gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cmdare.collective.elastic_group import ElasticGroup, PeerLost

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

__all__ = ["DEFAULT_BUCKET_BYTES", "GradientBuckets"]

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


class GradientBuckets:
    """The gradients of ``params`` averaged over ``group`` each step (:meth:`arm` before backward, :meth:`finish`
    after)."""

    def __init__(self, params: Sequence[torch.Tensor], group: ElasticGroup, cap_bytes: int = DEFAULT_BUCKET_BYTES):
        import torch

        self.group = group
        self.params = [p for p in params if p.requires_grad]
        self.buckets: list[list[int]] = []
        size = cap_bytes
        for i in reversed(range(len(self.params))):
            nbytes = self.params[i].numel() * self.params[i].element_size()
            if size + nbytes > cap_bytes and (not self.buckets or self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += nbytes
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.flat = [torch.zeros(sum(self.params[i].numel() for i in members), dtype=self.params[members[0]].dtype,
                                 device=self.params[members[0]].device) for members in self.buckets]
        self._left: list[int] = []
        self._works: list[Any] = []
        self._launched: list[bool] = []
        self._error: PeerLost | None = None
        self._armed = False
        self.weight: float | None = None  # this member's share of the global batch (None: the mean over members)
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self.params)]

    def _make_hook(self, index: int):
        def hook(_param: torch.Tensor) -> None:
            if not self._armed:
                return
            b = self.bucket_of[index]
            self._left[b] -= 1
            if self._left[b] == 0:
                try:
                    self._launch(b)
                except PeerLost as err:  # raised from finish(), not through autograd
                    self._error = err
        return hook

    def arm(self) -> None:
        """Before backward: launch each bucket's all-reduce as soon as its gradients are in."""
        self._armed = self.group.size > 1
        self._left = [len(members) for members in self.buckets]
        self._works = [None] * len(self.buckets)
        self._launched = [False] * len(self.buckets)
        self._error = None

    def _launch(self, b: int) -> None:
        offset, flat = 0, self.flat[b]
        for i in self.buckets[b]:
            p = self.params[i]
            n = p.numel()
            if p.grad is None:
                flat[offset:offset + n].zero_()
            else:
                flat[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        if self.weight is not None:
            flat.mul_(self.weight)
        self._launched[b] = True
        self._works[b] = self.group.allreduce(flat)

    def finish(self) -> None:
        """After backward: wait for every bucket (launching those with a gradient missing) and put the averages
        into ``.grad``.

        Raises:
            PeerLost: a member was lost: the gradients are not averaged and must not be applied.
        """
        if not self._armed:
            return
        self._armed = False
        try:
            if self._error is not None:
                raise self._error
            for b, launched in enumerate(self._launched):
                if not launched:
                    self._launch(b)
            self.group.wait(self._works)
        except PeerLost:
            self._works = []  # the works hold the broken group: dropped, its connections close
            raise
        size = self.group.size
        for b, members in enumerate(self.buckets):
            flat = self.flat[b] if self.weight is not None else self.flat[b].div_(size)
            offset = 0
            for i in members:
                p = self.params[i]
                n = p.numel()
                view = flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
                offset += n

    def close(self) -> None:
        """Remove the hooks from the parameters."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
