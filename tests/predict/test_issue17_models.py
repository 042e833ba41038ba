"""Issue 17: spec sheet, roofline step time on unseen GPUs, PS capacity from the placement,
prediction intervals and the planner's use of them (all on the shared CM-DARE data)."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.catalog import default_catalog
from cmdare.cloud.gpu_specs import SPEC_FIELDS, gpu_spec, gpu_specs, spec_sources
from cmdare.predict.evaluate import TASKS, evaluate_task

OURS = "cmdare StepTimeModel"
BEFORE = "cmdare StepTimeModel, TFLOPS only (the earlier form)"


@pytest.fixture(scope="module")
def step_errors():
    assert BEFORE in TASKS["step_time"].models  # today's model stays beside the new one
    frame, _ = evaluate_task("step_time", protocols=("loco", "logo"), models=(OURS, BEFORE))
    return frame.set_index(["model", "protocol", "subset"])["mape"]


def test_spec_sheet_covers_every_catalog_gpu_with_sources():
    catalog_gpus = {g.upper() for g in (o.gpu for o in default_catalog().find(role="worker")) if g}
    assert catalog_gpus <= set(gpu_specs())
    for name in gpu_specs():
        sources = spec_sources(name)
        assert set(sources) == {*SPEC_FIELDS, "architecture"} and all(s.strip() for s in sources.values())
    k80 = gpu_spec("k80")  # one die of the two-die board
    assert (k80.memory_bw_gbs, k80.memory_gb, k80.sms) == (240, 12, 13)
    assert gpu_spec("H100").memory_bw_gbs > gpu_spec("A100").memory_bw_gbs > gpu_spec("V100").memory_bw_gbs


def test_shipped_op_profiles_are_the_profilers():
    from cmdare.predict.op_profile import profile_model_ops, published_op_profiles
    from cmdare.predict.workloads import published_workload

    shipped = published_op_profiles()
    for name, prof in shipped.items():
        w = published_workload(name)
        assert len(prof.params) == w.num_tensors
        assert sum(int(np.prod(s)) for _, s in prof.params) == w.num_params
    fresh = profile_model_ops("t2t_resnet15")
    assert fresh.flops == pytest.approx(shipped["Res15"].flops)
    assert fresh.bytes == pytest.approx(shipped["Res15"].bytes)
    # T2T's "Model FLOPs" per sample trained vs the profiler's step FLOPs / batch: within 3%
    assert fresh.flops / fresh.batch == pytest.approx(published_workload("Res15").model_flops, rel=0.03)


def test_leave_one_gpu_out_improves_on_the_tflops_model(step_errors):
    ours, before = step_errors[(OURS, "logo", "all")], step_errors[(BEFORE, "logo", "all")]
    assert before == pytest.approx(18.1, abs=0.1)  # today's model, same run
    assert ours < 0.6 * before
    for gpu in ("K80", "P100"):
        assert step_errors[(OURS, "logo", gpu)] < step_errors[(BEFORE, "logo", gpu)]


def test_leave_one_gpu_out_at_most_10_percent(step_errors):
    # met by issue 45's cross-generation model (P100 held out: 8.5% -> 6.6%); 10.16% before
    assert step_errors[(OURS, "logo", "all")] <= 10.0


@pytest.mark.parametrize(("gpu", "today"), [("K80", 4.53), ("P100", 6.55)])
def test_leave_one_cnn_out_no_worse_than_before(step_errors, gpu, today):
    assert step_errors[(OURS, "loco", gpu)] <= today + 0.005
    assert step_errors[(OURS, "loco", gpu)] <= step_errors[(BEFORE, "loco", gpu)] + 1e-9


def test_ps_capacity_follows_the_placement():
    import cmdare.predict as P
    from cmdare.predict.ps_load import ps_loads

    w = P.published_workload("shakebig")
    loads = ps_loads(w.num_params, w.num_tensors, 2, "round-robin")
    assert sum(p for p, _ in loads) == pytest.approx(w.num_params)
    assert max(p for p, _ in loads) > 0.8 * w.num_params  # whole tensors in turn: one PS gets most bytes
    speeds = {pl: P.predict_cluster_steps_per_s("shakebig", {"p100": 8}, 2, placement=pl)
              for pl in ("round-robin", "greedy", "mxnet", "byteps", "psld")}
    assert speeds["psld"] == max(speeds.values())
    assert speeds["round-robin"] < 0.8 * speeds["psld"]
    one = {pl: P.predict_cluster_steps_per_s("t2t_resnet15", {"p100": 8}, 1, placement=pl) for pl in speeds}
    assert len({round(v, 9) for v in one.values()}) == 1  # one PS: the placement cannot matter
    # more PS never slows the balanced cluster down
    assert [P.predict_cluster_steps_per_s("t2t_resnet32", {"p100": 8}, p, placement="psld") for p in (1, 2, 3, 4)] == \
        sorted(P.predict_cluster_steps_per_s("t2t_resnet32", {"p100": 8}, p, placement="psld") for p in (1, 2, 3, 4))


@pytest.mark.parametrize(("task", "protocol"), [
    ("step_time", "loco"), ("cluster_speed", "loco"), ("checkpoint_remote", "loco"), ("checkpoint_local", "loco"),
])
def test_interval_coverage_within_5_points_leave_one_cnn_out(task, protocol):
    from cmdare.predict.intervals import coverage

    assert abs(coverage(task, protocol, 0.9)["all"] - 0.9) <= 0.05


@pytest.mark.xfail(strict=True, reason="issue 17 target missed: leave-one-GPU-out step-time coverage 81.7% at 90%")
def test_interval_coverage_within_5_points_leave_one_gpu_out():
    from cmdare.predict.intervals import coverage

    assert abs(coverage("step_time", "logo", 0.9)["all"] - 0.9) <= 0.05


def test_interval_is_wider_for_an_unseen_gpu():
    import cmdare.predict as P
    from cmdare.predict.intervals import interval, step_pool

    assert step_pool(P.gpu_tflops("k80")) == "step_seen" and step_pool(P.gpu_tflops("v100")) == "step_unseen"
    t = 1.0
    lo_s, hi_s = interval(t, "step_seen", 0.9)
    lo_u, hi_u = interval(t, "step_unseen", 0.9)
    assert lo_u < lo_s < 1 < hi_s < hi_u


def test_planner_p95_carries_the_speed_models_error():
    from cmdare.plan.adapters import load_plan_models
    from cmdare.plan.simulator import Simulator
    from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup

    cluster = ClusterSpec((WorkerGroup("v100", 2, True),), ps=1)
    job = JobSpec("t2t_resnet32", 20000)
    plain = Simulator(job, cluster, load_plan_models("t2t_resnet32", lifetime="none")).summarize(60, 0)
    assert plain.time_p95_s == plain.extra["deterministic_time_s"]  # no revocations, no model error
    models = load_plan_models("t2t_resnet32", lifetime="none", model_error=True)
    summary = Simulator(job, cluster, models).summarize(60, 0)
    # no revocations at all: the spread is the speed model's calibrated error (unseen V100: wider)
    assert summary.time_p95_s > 1.05 * summary.extra["deterministic_time_s"]
    assert summary.time_p95_s > summary.time_p50_s
