"""What ``cmdare train --resume RUN`` trains: the run's own configuration, changed only where asked.

A resumed run reads the configuration it started with from its storage (``run.json``, else the
latest checkpoint's metadata), so ``--resume RUN --storage URI`` on any machine continues the same
job without repeating its options; options given on the command line (``--steps 2000``) override.
Injected revocations never carry over onto a joined cluster: there, only ``--revocations`` asks
for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cmdare.errors import CheckpointError
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import CheckpointStore
from cmdare.train.runtime.run_files import read_run_spec
from cmdare.train.spec import TrainSpec

__all__ = ["resumed_spec", "stored_spec"]

# command-line options kept in spec.optimizer -> the fields they set there
_OPTIMIZER_OPTIONS = {"lr": ("lr",), "momentum": ("momentum",), "weight_decay": ("weight_decay",),
                      "lr_schedule": ("schedule", "total_steps"), "warmup_steps": ("warmup_steps",)}
_RENAMED = {"optimizer": "optimizer_name"}  # command-line option -> its TrainSpec field


def stored_spec(run: Storage) -> dict[str, Any] | None:
    """The configuration run ``run`` started with (``run.json``, else its latest checkpoint), or None."""
    spec = read_run_spec(run)
    if spec is not None:
        return spec
    store = CheckpointStore(run)
    if store.latest() is None:
        return None
    try:
        return store.load().meta.get("spec")
    except CheckpointError:
        return None  # the resume itself reports the broken checkpoint


def resumed_spec(run: Storage, given: TrainSpec, explicit: Iterable[str], joined: bool) -> TrainSpec:
    """The run's stored configuration with the ``explicit`` command-line options of ``given`` applied.

    Args:
        run: the run's storage location.
        given: the spec the command line describes (defaults included).
        explicit: names of the options the user gave (``steps``, ``lr``, ``revocations``, ...).
        joined: the resumed run joins a cluster (``--address``): stored injected revocations are dropped.
    """
    base = stored_spec(run)
    if base is None:
        return given  # nothing stored: resuming says what is missing
    data = dict(base)
    new = given.to_dict()
    explicit = set(explicit)
    for name in explicit:
        if name in _OPTIMIZER_OPTIONS:
            data["optimizer"] = dict(data.get("optimizer") or {},
                                     **{field: new["optimizer"][field] for field in _OPTIMIZER_OPTIONS[name]})
        elif name in _RENAMED:
            data[_RENAMED[name]] = new[_RENAMED[name]]
        elif name == "transient":
            data["transient"], data["revocations"] = new["transient"], new["revocations"]
        elif name == "workers":  # a count or a GPU mix: both fields
            data["workers"], data["worker_gpus"] = new["workers"], new["worker_gpus"]
        elif name in new:
            data[name] = new[name]
    opt = dict(data.get("optimizer") or {})
    if "steps" in explicit and opt.get("schedule") == "cosine" and opt.get("total_steps") == base.get("steps"):
        data["optimizer"] = dict(opt, total_steps=data["steps"])  # the cosine decays over the run's new length
    if given.storage is not None:
        data["storage"] = given.storage
    if joined and "revocations" not in explicit and data.get("transient"):
        data["revocations"] = "none"  # real servers: revoked by their cloud, never by emulation unless asked
    return TrainSpec.from_dict(data)
