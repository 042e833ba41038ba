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

_OPTIMIZER_OPTIONS = {"lr", "momentum", "weight_decay"}  # command-line options kept in spec.optimizer


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
            data["optimizer"] = dict(data.get("optimizer") or {}, **{name: new["optimizer"][name]})
        elif name == "transient":
            data["transient"], data["revocations"] = new["transient"], new["revocations"]
        elif name == "workers":  # a count or a GPU mix: both fields
            data["workers"], data["worker_gpus"] = new["workers"], new["worker_gpus"]
        elif name in new:
            data[name] = new[name]
    if given.storage is not None:
        data["storage"] = given.storage
    if joined and "revocations" not in explicit and data.get("transient"):
        data["revocations"] = "none"  # real servers: revoked by their cloud, never by emulation unless asked
    return TrainSpec.from_dict(data)
