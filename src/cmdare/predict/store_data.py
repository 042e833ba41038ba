"""cmdare's own measurements from the measurement store, in the columns the models take.

Only measurements whose features mean the same thing in every source are merged with the public
data: checkpoint timings (size, #tensors -> seconds) and server startup phases. Step-time and
cluster-speed rows of cmdare's own runs describe zoo models whose FLOPs come from cmdare's
profiler, a different convention from Tensor2Tensor's; mixing them into one fit would corrupt the
FLOPs coefficient, so they are not merged (see docs/models.md). Rows imported from the public
CM-DARE files (source ``cmdare:...``) are skipped: the models already read those files.

What is emulated is never used (docs/models.md, "What an emulated run teaches"): a server's start-up
phases in an emulated run were drawn from the startup model itself, so such servers are left out. A
checkpoint's duration is real I/O in every run (the run's real bytes, written to its real storage and
timed by the wall clock; emulation stretches no checkpoint), so checkpoints of emulated runs are used.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["PUBLIC_SOURCE_PREFIX", "SKIP_EMULATED_SERVER", "own_checkpoint_rows", "own_startup_rows",
           "startup_rows"]

PUBLIC_SOURCE_PREFIX = "cmdare:"
#: Why a server of the store is not used by the startup model.
SKIP_EMULATED_SERVER = "emulated (start-up phases drawn from the startup model)"


def _own(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["source"].astype(str).str.startswith(PUBLIC_SOURCE_PREFIX)]


def own_checkpoint_rows(store) -> pd.DataFrame:
    """Checkpoints written by cmdare runs: ``Checkpoint Size (MB)``, ``Number of Tensors``,
    ``Local duration`` and ``Duration`` (save + upload; NaN when not uploaded)."""
    frame = _own(store.frame("checkpoints"))
    frame = frame[(frame["size_bytes"] > 0) & (frame["local_duration_s"] > 0)]
    return pd.DataFrame(
        {
            "Checkpoint Size (MB)": frame["size_bytes"].astype(float) / 1e6,
            "Number of Tensors": pd.to_numeric(frame["num_tensors"], errors="coerce"),
            "Local duration": frame["local_duration_s"].astype(float),
            "Duration": pd.to_numeric(frame["remote_duration_s"], errors="coerce"),
        }
    ).reset_index(drop=True)


def _coast(region: object) -> str:
    from cmdare.predict.startup import _region_key

    return _region_key(str(region) if region else None)


def startup_rows(store) -> tuple[pd.DataFrame, dict[str, int]]:
    """Servers cmdare started with all three phases recorded (gpu, region, transient, phases), and how many
    were left out by reason (``{reason: count}``): emulated servers, whose phases came from the model."""
    frame = _own(store.frame("servers"))
    emulated = frame["emulated"].fillna(False).astype(bool)
    skipped = {SKIP_EMULATED_SERVER: int(emulated.sum())} if emulated.any() else {}
    frame = frame[~emulated].dropna(subset=["gpu_type", "provisioning_s", "staging_s", "booting_s"])
    rows = pd.DataFrame(
        {
            "gpu": frame["gpu_type"].astype(str).str.upper(),
            "region": frame["region"].map(_coast),
            "transient": frame["transient"].astype(bool),
            "Provisioning": frame["provisioning_s"].astype(float),
            "Staging": frame["staging_s"].astype(float),
            "Booting": frame["booting_s"].astype(float),
        }
    ).reset_index(drop=True)
    return rows, skipped


def own_startup_rows(store) -> pd.DataFrame:
    """Servers cmdare started with all three phases recorded: gpu, region, transient, phases.

    Emulated servers are left out: their phases were drawn from the startup model itself.
    """
    return startup_rows(store)[0]
