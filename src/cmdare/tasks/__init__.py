"""cmdare.tasks: what a run trains, from the zoo and the built-in datasets or from your own code.

    >>> from cmdare.tasks import build_task
    >>> task = build_task("resnet15", "digits")                     # the zoo on a built-in dataset
    >>> task = build_task("mypkg.models:build_net", "mypkg.data:make_sets", loss="torch.nn.functional:mse_loss")

Both providers give one :class:`Task`: the model factory, deterministic per-slot batches, the loss and the
evaluation (see :mod:`cmdare.tasks.task`); the parts may be objects or import paths (:mod:`cmdare.tasks.parts`).
"""

from __future__ import annotations

from cmdare.tasks.parts import check_part, part_name
from cmdare.tasks.task import Evaluation, Task, build_task, is_builtin_dataset

__all__ = ["Evaluation", "Task", "build_task", "check_part", "is_builtin_dataset", "part_name"]
