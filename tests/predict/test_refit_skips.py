"""`cmdare models fit --from-store` never learns from emulated runs and never fails on one past run (issue 42).

Before: the refit fitted K80 speed from local CPU runs (emulated K80s): 1xK80 for 64,000 steps of T2T ResNet-32
was predicted at 1h02m instead of about 3h52m, and it failed outright (`cannot import waves.data`) while one past
run's package was not importable. The store here is a real SQLite store written by the real recorder's hooks, as
`cmdare train` writes it: an emulated local run, a run joined to a real cluster with no injected revocations (the
non-emulated kind) and a run of a user's model whose package is gone.
"""

from __future__ import annotations

import pytest
from test_predict_cli import run

from cmdare.events import CheckpointReport, EventReport, RunInfo, RunSummary, StepReport
from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.store import open_store

T0 = 1.8e9


def _clear_caches() -> None:
    import cmdare.predict as P
    from cmdare.predict.intervals import calibration_pools
    from cmdare.predict.refine import load_refinement

    for fn in (P.step_time_model, P.cluster_speed_model, P.checkpoint_model, P.startup_model, load_refinement,
               calibration_pools):
        fn.cache_clear()


def _prior_step_s() -> float:
    """Seconds per step of each of 2 K80 workers training resnet8 by the public-data model (the prior)."""
    import cmdare.predict as P
    from cmdare.predict.refine import zoo_workload_features

    return 2 / P.speed_with_scales(zoo_workload_features("resnet8"), {"k80": 2}, 1)


def _record(url: str, run_id: str, *, emulated: bool, step_s: float, model: str = "resnet8",
            dataset: str = "digits") -> None:
    """One finished run of 2 K80 workers and 1 PS as the recorder writes it: servers, 40 chunks, a checkpoint."""
    rec = StoreRecorder(url)
    config = {"model": model, "dataset": dataset, "workers": 2, "ps": 1, "placement": "round-robin",
              "provider": "local" if emulated else "ray", "revocations": "lifetime=bathtub" if emulated else "none"}
    rec.on_run_start(RunInfo(run_id, config, T0, "test", emulated=emulated))
    for w in range(2):
        server = {"role": "worker", "gpu_type": "k80", "cloud": "gcp", "transient": True, "region": "us-east1",
                  "price_per_hour_usd": 0.135, "requested_at": T0, "emulated": emulated}
        if emulated:  # phases drawn from the startup model
            server.update(provisioning_s=20.0, staging_s=40.0, booting_s=30.0)
        rec.on_event(EventReport(run_id, T0, "server_requested", 0, w, None, f"{run_id}-w{w}", server))
        rec.on_event(EventReport(run_id, T0 + 1, "server_joined", 0, w, None, f"{run_id}-w{w}", {"joined_at": T0 + 1}))
    for i in range(40):
        for w in range(2):
            rec.on_step(StepReport(run_id, T0 + 2 + i * 10 * step_s, 20 * i + 10 * w, w, 10, 10 * step_s, 1.0, 0.0))
    rec.on_checkpoint(CheckpointReport(run_id, T0 + 5, 400, 0, "/ck", 1_000_000, 0.05, 30))
    rec.on_run_end(RunSummary(run_id, T0 + 10, "finished", 800, 10.0, 2 / step_s, 0.5, 1.0))
    rec.close()


@pytest.fixture
def home(tmp_path):
    _clear_caches()
    yield tmp_path
    _clear_caches()


def _fit(home) -> str:
    out = run({"CMDARE_HOME": str(home)}, "models", "fit", "--from-store")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _k80_64k_s(home) -> float:
    """Predicted seconds of 64,000 steps of T2T ResNet-32 on one K80 (after the refit saved in ``home``)."""
    import os

    import cmdare.predict as P

    old = os.environ["CMDARE_HOME"]
    os.environ["CMDARE_HOME"] = str(home)
    try:
        _clear_caches()
        return 64_000 * P.predict_step_time_s("t2t_resnet32", "k80", batch_size=128)  # ICAC 2019 ran T2T's 128
    finally:
        os.environ["CMDARE_HOME"] = old
        _clear_caches()


def test_an_emulated_run_teaches_no_speed_model(home):
    """The issue's case: fast local CPU runs labelled K80. Before: '1 runs' used, K80 refined 20x faster."""
    url = f"sqlite:///{home / 'cmdare.db'}"
    open_store(url).close()
    _record(url, "run-local", emulated=True, step_s=_prior_step_s() / 20)  # a CPU 20x faster than the K80 prior
    out = _fit(home)
    assert "and 0 runs from the store; skipped 1 runs and 2 servers" in out, out
    assert "skipped 1 run(s) (run-local): emulated" in out, out
    assert "skipped 2 server(s): emulated (start-up phases drawn from the startup model)" in out, out
    assert "speed k80" not in out  # nothing refined
    published = 14_080  # CM-DARE: about 14,080 s of T2T ResNet-32 on a K80
    assert _k80_64k_s(home) == pytest.approx(published, rel=0.1)
    plan = run({"CMDARE_HOME": str(home)}, "plan", "simulate", "--model", "t2t_resnet32", "--workers", "k80:1",
               "--steps", "2000", "--runs", "5")
    assert plan.returncode == 0, plan.stderr
    flat = " ".join(plan.stdout.split())
    assert "refined with the store's runs" not in flat and "speed models: public CM-DARE data" in flat


def test_a_real_run_is_used_and_an_unimportable_model_is_skipped_with_its_reason(home):
    """Before: `error: ... cannot import gonepkg ...`, exit 1, and nothing refitted."""
    url = f"sqlite:///{home / 'cmdare.db'}"
    open_store(url).close()
    step_s = _prior_step_s()
    _record(url, "run-local", emulated=True, step_s=step_s / 20)
    _record(url, "run-cluster", emulated=False, step_s=step_s)  # joined a real cluster, no injected revocations
    _record(url, "run-gone", emulated=False, step_s=step_s, model="gonepkg.model:build_net",
            dataset="gonepkg.data:make_sets")
    out = _fit(home)
    assert "and 1 runs from the store; skipped 2 runs" in out, out
    assert "skipped 1 run(s) (run-local): emulated" in out, out
    gone = next(line for line in out.splitlines() if "run-gone" in line)
    assert "model does not load here" in gone and "cannot import gonepkg" in gone, out
    assert "speed k80: 1 run, correction fitted" in out, out
    # the real run ran at the prior's speed: the refined K80 stays where the public data put it
    assert _k80_64k_s(home) == pytest.approx(14_080, rel=0.1)
    # checkpoints are real I/O in every run, emulated or not (docs/models.md): all three are used
    assert "added 3 checkpoints" in out, out
