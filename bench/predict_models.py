"""Accuracy of cmdare's performance models vs the published baselines, plus query latency.

Run: .venv/bin/python bench/predict_models.py
Last line: one JSON object (MAPE in %, ratios = cmdare / baseline on the same split).
"""

from __future__ import annotations

import json
import time


def main() -> None:
    import cmdare.predict as P
    from cmdare.predict.evaluate import evaluate

    start = time.perf_counter()
    frame, _ = evaluate()
    eval_s = time.perf_counter() - start
    mape = frame.set_index(["task", "model", "protocol", "subset"])["mape"]
    figures = {
        "step_loco_k80": mape[("step_time", "cmdare StepTimeModel", "loco", "K80")],
        "step_loco_p100": mape[("step_time", "cmdare StepTimeModel", "loco", "P100")],
        "step_loco_svr_k80": mape[("step_time", "published SVR on normalized FLOPs (per GPU)", "loco", "K80")],
        "step_loco_svr_p100": mape[("step_time", "published SVR on normalized FLOPs (per GPU)", "loco", "P100")],
        "step_logo": mape[("step_time", "cmdare StepTimeModel", "logo", "all")],
        "step_logo_flops_ratio": mape[("step_time", "published linear on FLOPs/TFLOPS", "logo", "all")],
        "cluster_loo": mape[("cluster_speed", "cmdare PSQueueModel", "loo", "all")],
        "cluster_loo_optimus": mape[("cluster_speed", "Optimus f(p,w)", "loo", "all")],
        "cluster_loo_sum": mape[("cluster_speed", "sum of workers", "loo", "all")],
        "ckpt_random": mape[("checkpoint_remote", "cmdare CheckpointModel", "random", "all")],
        "ckpt_random_svr": mape[("checkpoint_remote", "published SVR on size", "random", "all")],
        "ckpt_loco": mape[("checkpoint_remote", "cmdare CheckpointModel", "loco", "all")],
        "ckpt_loco_svr": mape[("checkpoint_remote", "published SVR on size", "loco", "all")],
    }
    figures = {k: round(float(v), 2) for k, v in figures.items()}
    figures["ratio_step_loco_k80"] = round(figures["step_loco_k80"] / figures["step_loco_svr_k80"], 3)
    figures["ratio_step_loco_p100"] = round(figures["step_loco_p100"] / figures["step_loco_svr_p100"], 3)
    figures["ratio_cluster_vs_optimus"] = round(figures["cluster_loo"] / figures["cluster_loo_optimus"], 3)
    figures["ratio_ckpt_random_vs_svr"] = round(figures["ckpt_random"] / figures["ckpt_random_svr"], 3)
    figures["step_logo_one_roofline"] = round(float(mape[("step_time", "cmdare StepTimeModel, one roofline for "
                                                               "every GPU (before issue 45)", "logo", "all")]), 2)
    figures |= _generation_figures()
    P.predict_cluster_steps_per_s("t2t_resnet32", {"k80": 1}, 1)  # load models
    n = 500
    start = time.perf_counter()
    for i in range(n):
        P.predict_cluster_steps_per_s("t2t_resnet32", {"k80": 1 + i % 8, "p100": i % 4}, 1 + i % 3)
    figures["cluster_query_ms"] = round((time.perf_counter() - start) / n * 1000, 3)
    start = time.perf_counter()
    for _ in range(n):
        P.predict_step_time_s("t2t_resnet32", "v100")
    figures["step_query_ms"] = round((time.perf_counter() - start) / n * 1000, 3)
    figures["evaluate_all_s"] = round(eval_s, 1)
    print(json.dumps(figures))


def _generation_figures() -> dict:
    """Issue 45: the cross-generation model's held-out V100 check, its leave-one-out errors, the 2-PS check."""
    from cmdare.predict.generation_eval import generation_errors, held_out_v100
    from cmdare.predict.two_ps_check import two_ps_errors

    errors = generation_errors().set_index(["protocol", "held_out", "dataset"])["mape"]
    two = two_ps_errors()
    out = {
        "v100_held_out_cmdare": held_out_v100()["error_pct"].abs().mean(),
        "generations_logo_v100_cmdare": errors[("leave-one-GPU-out", "V100", "cmdare-v100")],
        "generations_logo_v100_gavel": errors[("leave-one-GPU-out", "V100", "gavel")],
        "generations_lofo_resnet50_gavel": errors[("leave-one-family-out", "ResNet-50", "gavel")],
        "two_ps_from_measured_step": two["error_measured_step_pct"].abs().mean(),
        "two_ps_from_predicted_step": two["error_predicted_step_pct"].abs().mean(),
    }
    return {k: round(float(v), 2) for k, v in out.items()}


if __name__ == "__main__":
    main()
