"""A training run's controller, built from its spec: the run's configuration as the controller sees it, its
policy kernels and, in local emulation, the emulated clock."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from cmdare.control import (
    EmulatedClock,
    MembershipKernel,
    NoRevocations,
    PsServerKernel,
    RevocationPlan,
    RevocationSource,
    RunConfig,
    RunController,
)
from cmdare.control.offers import ReplacementOffers
from cmdare.control.run_config import run_config_for
from cmdare.train.run.gpu_speeds import step_time_s, steps_per_s
from cmdare.train.spec import TrainSpec

if TYPE_CHECKING:
    from cmdare.control.balancers import DecisionSource
    from cmdare.predict.workloads import WorkloadFeatures
    from cmdare.ps.placement import Placement

__all__ = ["DEFAULT_STEP_S", "EmulatedStepTimes", "build_controller", "run_config", "run_workload"]

DEFAULT_STEP_S = 0.1  # emulated seconds per step of a GPU type the step-time model cannot rank
START_TIMEOUT_S = 300.0  # a local worker process that is not up in this long failed to start
STUCK_AFTER_S = 600.0  # no step for this long, though everything answers: the run fails
PROBE_AFTER_S = 20.0  # no news for this long: the workers, the shards and the cluster are asked whether they live


class EmulatedStepTimes(Mapping[str, float]):
    """Emulated cloud seconds per worker step, by GPU type: ``step=`` of ``--revocations`` for every type, else
    the step-time model's prediction for the run's model at its per-worker ``batch_size`` (asked once per type,
    when a type first appears)."""

    def __init__(self, model: str | WorkloadFeatures, fixed_s: float | None, types: tuple[str, ...],
                 batch_size: int | None = None):
        self.model, self.fixed_s, self.batch_size = model, fixed_s, batch_size
        self._known: dict[str, float] = {}
        for t in types:
            self[t]  # noqa: B018 - asked now: a model that cannot be profiled fails before the run

    def __getitem__(self, gpu: str) -> float:
        key = gpu.lower()
        if key not in self._known:
            if key == "*" or self.fixed_s is not None:
                self._known[key] = self.fixed_s if self.fixed_s is not None else DEFAULT_STEP_S
            else:
                self._known[key] = step_time_s(self.model, key, self.batch_size) or DEFAULT_STEP_S
        return self._known[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)


def run_workload(spec: TrainSpec) -> tuple[str | WorkloadFeatures, float | None]:
    """What the step-time model predicts the run's steps for: the model's name on a built-in dataset (the zoo's
    networks at their measured or profiled features); your own model profiled on one sample of your data (traced
    with its dtype, or counted on that real sample where the trace fails). A model that cannot be profiled at
    all has its step time measured on this machine: the second value, the emulated seconds per step (else None).
    Either fallback is said on stderr in one line."""
    from cmdare.tasks import is_builtin_dataset

    if is_builtin_dataset(spec.dataset):
        return spec.model_name, None
    from cmdare.predict.workloads import profile_features
    from cmdare.workloads.profile import SAMPLE, ProfileError, profile_model

    task = spec.task()
    x, _ = next(task.stream(0, 1, 1, spec.seed))
    model = task.build()
    shape = tuple(x.shape[1:]) if hasattr(x, "shape") else ()  # an input that is no tensor: the sample tells
    try:
        profile = profile_model(model, shape, sample=x)
    except ProfileError as err:
        step_s = task.time_step(model, spec.batch_size, spec.seed)
        _note(f"--model {spec.model_name} cannot be profiled ({err}): its step time was measured instead, "
              f"{step_s:.4g} s on this machine, and emulated servers of every GPU type take that long a step")
        return spec.model_name, step_s
    if profile.basis == SAMPLE:
        _note(f"--model {spec.model_name} cannot be traced on the meta device (without arithmetic): its FLOPs "
              "were counted on a real sample of its data")
    return profile_features(spec.model_name, profile), None


def _note(text: str) -> None:
    print(f"note: {' '.join(text.split())}", file=sys.stderr, flush=True)


def run_config(spec: TrainSpec, plan: RevocationPlan, run_id: str, real: bool, checkpoints: str = "",
               resumed_from: int | None = None) -> RunConfig:
    """The controller's view of ``spec``: a real cluster's (wall clock, replacements join when up) or an
    emulated run's (cloud time from training, replacements join when their emulated start-up ends)."""
    return run_config_for(
        "real" if real else "emulated", steps=spec.steps, workers=spec.workers, sync=spec.sync,
        checkpoint_every=spec.checkpoint_every, eval_every=spec.eval_every, balance_every=spec.balance_every,
        hit_workers=spec.transient and plan.hits("worker"), hit_ps=spec.ps_transient and plan.hits("ps"),
        ps_notice_s=plan.notice_lead_s(spec.cloud), replace_ps=spec.replace != "none",
        replacement_timeout_s=spec.replacement_timeout_s, start_timeout_s=START_TIMEOUT_S,
        probe_after_s=max(PROBE_AFTER_S, 40 * spec.chunk_s), stuck_after_s=STUCK_AFTER_S,
        max_rollbacks=spec.max_rollbacks(), rollback_lr_scale=spec.rollback_lr_scale, topology=spec.topology,
        step_s=_step_times(spec, plan), run_id=run_id, warm_spares=spec.warm_spares,
        checkpoints=checkpoints, resumed_from=resumed_from)


def _step_times(spec: TrainSpec, plan: RevocationPlan) -> EmulatedStepTimes:
    """``step=`` of ``--revocations`` for every GPU type; else the step-time model's for the run's workload,
    or the step time measured here for a model that cannot be profiled."""
    workload, measured_s = run_workload(spec) if plan.step_s is None else (spec.model_name, None)
    return EmulatedStepTimes(workload, plan.step_s if plan.step_s is not None else measured_s,
                             tuple(spec.slot_gpus()), spec.batch_size)


def build_controller(spec: TrainSpec, plan: RevocationPlan, source: RevocationSource, run_id: str,
                     real: bool, checkpoints: str = "", resumed_from: int | None = None,
                     balancer: DecisionSource | None = None, placement: Placement | None = None) -> RunController:
    """The run's controller: the membership kernel (replacement, LR and chief policies; the revocation source),
    the PS-server kernel (the cloud's notice lead; the same source when it hits PS servers), the placement's
    sources (``balancer``; the shards' ``placement`` at the start) and, in local emulation, the emulated clock."""
    from cmdare.cloud.catalog import default_catalog

    config = run_config(spec, plan, run_id, real, checkpoints, resumed_from)
    speed = None  # ``cheapest`` prices the offers at the speeds the run would train at: emulated, or the model's
    if spec.replace in ("cheapest", "cost-efficient"):  # (speeds cost a model fit: asked only where needed)
        speed = steps_per_s(spec.model_name, spec.batch_size) if real else lambda gpu: 1.0 / config.step_s[gpu]
    kernel = MembershipKernel(spec.workers, replacement=spec.replace, lr_policy=spec.lr_policy, revocations=source,
                              offers=ReplacementOffers(default_catalog(), speed))
    ps_source = source if spec.ps_transient and plan.hits("ps") else NoRevocations()
    ps_kernel = PsServerKernel(ps_source, notice_s=plan.notice_lead_s(spec.cloud), replace=spec.replace != "none")
    return RunController(config, kernel, ps_kernel, None if real else EmulatedClock(), balancer=balancer,
                         placement=placement)
