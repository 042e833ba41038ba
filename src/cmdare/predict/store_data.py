"""cmdare's own measurements from the measurement store, in the columns the models take.

Only measurements whose features mean the same thing in every source are merged with the public
data: checkpoint timings (size, #tensors -> seconds) and server startup phases. Step-time and
cluster-speed rows of cmdare's own runs describe zoo models whose FLOPs come from cmdare's
profiler, a different convention from Tensor2Tensor's; mixing them into one fit would corrupt the
FLOPs coefficient, so they are not merged (see docs/models.md). Rows imported from the public
CM-DARE files (source ``cmdare:...``) are skipped: the models already read those files.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["PUBLIC_SOURCE_PREFIX", "own_checkpoint_rows", "own_startup_rows"]

PUBLIC_SOURCE_PREFIX = "cmdare:"


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


def own_startup_rows(store) -> pd.DataFrame:
    """Servers cmdare started with all three phases recorded: gpu, region, transient, phases.

    Emulated servers are left out: their phases were drawn from the startup model itself.
    """
    frame = _own(store.frame("servers"))
    frame = frame[~frame["emulated"].fillna(False).astype(bool)]
    frame = frame.dropna(subset=["gpu_type", "provisioning_s", "staging_s", "booting_s"])
    return pd.DataFrame(
        {
            "gpu": frame["gpu_type"].astype(str).str.upper(),
            "region": frame["region"].map(_coast),
            "transient": frame["transient"].astype(bool),
            "Provisioning": frame["provisioning_s"].astype(float),
            "Staging": frame["staging_s"].astype(float),
            "Booting": frame["booting_s"].astype(float),
        }
    ).reset_index(drop=True)
