"""The 2-PS check: CM-DARE's P100 runs with two parameter servers, predicted by the cluster-speed model fitted on the
1-PS runs only (a configuration its training data never had)."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd

__all__ = ["two_ps_errors"]

_ZOO = {"Res15": "t2t_resnet15", "Res32": "t2t_resnet32", "shakesmall": "shake_shake_32", "shakebig": "shake_shake_96"}


def two_ps_errors(placement: str = "round-robin") -> pd.DataFrame:
    """One row per 2-PS run: measured steps/s, and the prediction from the measured single-GPU step time (the
    cluster task's protocol) and from the predicted one (what ``predict cluster-speed`` answers), with signed
    errors in %. ``placement``: how the model places tensors on the two PS (TensorFlow's was round-robin)."""
    import cmdare.predict as P
    from cmdare.predict.cluster_speed import CLUSTER_COLUMNS
    from cmdare.predict.data import load_two_ps_cluster_speed

    df = load_two_ps_cluster_speed().sort_values(["cnn", "Workers"]).reset_index(drop=True)
    model = copy.deepcopy(P.cluster_speed_model()).set_params(placement=placement)  # the shared one stays as is
    from_measured = model.predict(df[list(CLUSTER_COLUMNS)].to_numpy(float))
    from_predicted = np.array([
        P.predict_cluster_steps_per_s(_ZOO[r.cnn], {"p100": int(r.Workers)}, ps=2, placement=placement, refined=False,
                                      batch_size=128)
        for r in df.itertuples()])
    y = df["Speed (steps/sec)"].to_numpy(float)
    return pd.DataFrame({"cnn": df["cnn"], "workers": df["Workers"], "measured": y,
                         "from_measured_step": from_measured, "error_measured_step_pct": (from_measured - y) / y * 100,
                         "from_predicted_step": from_predicted,
                         "error_predicted_step_pct": (from_predicted - y) / y * 100})
