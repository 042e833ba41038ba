"""Errors of the cross-generation step-time model: leave one GPU out, leave one model family out, and the
held-out V100 check of the CM-DARE networks, each per dataset (``cmdare models evaluate --task generations``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cmdare.predict.generation_data import Row
from cmdare.predict.generations import GenerationStepModel

__all__ = ["generation_errors", "held_out_v100"]


def _predict(model: GenerationStepModel, rows: list[Row]) -> np.ndarray:
    from cmdare.cloud.gpu_specs import gpu_spec

    return np.array([model.predict(r.profile, gpu_spec(r.gpu), r.num_params, r.num_tensors,
                                   parameter_server=r.parameter_server) for r in rows])


def _ape(model: GenerationStepModel, rows: list[Row]) -> np.ndarray:
    y = np.array([r.step_time_s for r in rows])
    return (_predict(model, rows) - y) / y * 100


def held_out_v100(rows: list[Row] | None = None) -> pd.DataFrame:
    """The CM-DARE V100 rows predicted by a model fitted on every other row: one row per CNN (signed error, %)."""
    from cmdare.predict.generation_data import training_rows

    rows = list(rows or training_rows())
    test = [r for r in rows if r.dataset == "cmdare-v100"]
    model = GenerationStepModel().fit([r for r in rows if r.dataset != "cmdare-v100"])
    pred = _predict(model, test)
    return pd.DataFrame({"cnn": [r.model for r in test], "measured_s": [r.step_time_s for r in test],
                         "predicted_s": pred, "error_pct": _ape(model, test)})


def generation_errors(rows: list[Row] | None = None) -> pd.DataFrame:
    """MAPE (%) per protocol (``in-sample``, ``leave-one-GPU-out``, ``leave-one-family-out``), held-out group and
    dataset."""
    from cmdare.predict.generation_data import training_rows

    rows = list(rows or training_rows())
    out = []
    full = GenerationStepModel().fit(rows)
    for protocol, key in (("in-sample", None), ("leave-one-GPU-out", "gpu"), ("leave-one-family-out", "family")):
        groups = [None] if key is None else sorted({getattr(r, key) for r in rows})
        for group in groups:
            test = rows if group is None else [r for r in rows if getattr(r, key) == group]
            model = full if group is None else GenerationStepModel().fit([r for r in rows if getattr(r, key) != group])
            ape = np.abs(_ape(model, test))
            for dataset in sorted({r.dataset for r in test}):
                mask = np.array([r.dataset == dataset for r in test])
                out.append({"protocol": protocol, "held_out": group or "-", "dataset": dataset,
                            "mape": float(ape[mask].mean()), "max_ape": float(ape[mask].max()), "n": int(mask.sum())})
    return pd.DataFrame(out)
