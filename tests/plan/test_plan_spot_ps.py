"""The planner prices spot parameter servers: notices evacuate shards (a pause), no notice rolls back."""

from __future__ import annotations

import dataclasses
import json

from plan_toys import run_cli

from cmdare.plan.adapters import load_plan_models
from cmdare.plan.evacuation import DEFAULT_EVACUATION, EvacuationModel
from cmdare.plan.recommender import enumerate_clusters
from cmdare.plan.simulator import Simulator
from cmdare.plan.spec import ClusterSpec, JobSpec, WorkerGroup

JOB = JobSpec("t2t_resnet32", 640_000, 1000)  # about 10 h on 4 K80s: several PS servers are revoked


def _cluster(ps_transient: bool, ps: int = 2) -> ClusterSpec:
    return ClusterSpec((WorkerGroup("k80", 4, True, "us-east1"),), ps=ps, region="us-east1",
                       ps_transient=ps_transient)


def test_spot_ps_with_notices_evacuates_and_loses_no_steps_where_rollback_would():
    models = load_plan_models("t2t_resnet32", lifetime="bathtub")
    spot = Simulator(JOB, _cluster(True), models).summarize(60, seed=2)
    no_notice = Simulator(JOB, _cluster(True), dataclasses.replace(models, evacuation=None)).summarize(60, seed=2)
    on_demand = Simulator(JOB, _cluster(False), models).summarize(60, seed=2)
    assert spot.extra["evacuations_mean"] > 0.5 and spot.steps_lost_mean == 0
    assert no_notice.extra["evacuations_mean"] == 0 and no_notice.steps_lost_mean > 0
    assert spot.time_mean_s < no_notice.time_mean_s  # evacuating beats rolling back
    assert spot.cost_mean_usd < on_demand.cost_mean_usd  # spot PS servers are cheaper
    assert spot.time_mean_s < on_demand.time_mean_s * 1.02  # for little time: pauses and one PS fewer a while


def test_last_shard_parks_until_its_replacement_is_up_when_the_notice_is_too_short():
    # as the trainer does (the same controller): the last shard's blocks wait in the coordinator, nothing is lost
    models = load_plan_models("t2t_resnet32", lifetime="bathtub")  # GCE: 30 s notice, PS start-up about 1-2 min
    gce = Simulator(JOB, _cluster(True, ps=1), models).summarize(40, seed=2)
    slow = dataclasses.replace(models, notice_s=3600.0)  # a notice long enough for any start-up
    long_notice = Simulator(JOB, _cluster(True, ps=1), slow).summarize(40, seed=2)
    assert gce.extra["parks_mean"] > 0 and gce.extra["evacuations_mean"] == gce.extra["parks_mean"]
    assert gce.steps_lost_mean == 0
    assert long_notice.extra["evacuations_mean"] > 0 and long_notice.extra["parks_mean"] == 0
    assert long_notice.steps_lost_mean == 0
    assert gce.time_mean_s > long_notice.time_mean_s  # training paused until each replacement was up


def test_evacuation_model_fits_pauses_by_bytes():
    model = EvacuationModel.fit([(1e6, 0.2), (2e6, 0.3), (4e6, 0.5)], "test")
    assert abs(model.fixed_s - 0.1) < 1e-9 and abs(model.bytes_per_s - 1e7) < 1e-3 and model.events == 3
    assert model.pause_s(3e6) == model.fixed_s + 0.3
    assert EvacuationModel.fit([(1e6, 0.2)], "too few") is DEFAULT_EVACUATION


def test_store_evacuations_feed_the_model(tmp_path):
    from cmdare.measure.store import open_store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    store.insert_rows("events", [{"run_id": "r", "time": float(i), "kind": "shard_evacuated", "global_step": i,
                                  "details": {"moved_bytes": b, "pause_s": p}}
                                 for i, (b, p) in enumerate([(1e6, 0.3), (3e6, 0.5), (5e6, 0.7)])])
    store.close()
    model = EvacuationModel.from_store(url)
    assert model.events == 3 and "3 evacuations" in model.source and abs(model.fixed_s - 0.2) < 1e-6


def test_ps_market_any_offers_spot_ps_and_says_when_it_pays(monkeypatch, capsys):
    clusters = enumerate_clusters(["k80"], ["us-east1"], 2, 2, ps_markets=(False, True))
    assert {c.ps_transient for c in clusters if c.ps} == {False, True}
    assert not any(c.ps_transient for c in clusters if c.ps == 0)
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--batch-size",
                           "128", "--deadline", "3h", "--gpus", "k80", "--max-workers", "4", "--max-ps", "2",
                           "--no-mixes", "--runs", "20", "--ps-market", "any", "--topologies", "ps", "--json")
    assert code == 0
    data = json.loads(out)
    assert any("PS spot" in o["config"] for o in data["front"])
    assert any("spot PS" in r for r in data["reasons"])
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "simulate", "--model", "t2t_resnet32", "--steps", "64000",
                           "--workers", "k80:4", "--ps", "2", "--transient", "--ps-transient", "--runs", "10",
                           "--json")
    assert code == 0 and "evacuations_mean" in json.loads(out)
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "t2t_resnet32", "--steps", "100",
                           "--ps-market", "sometimes")
    assert code == 1 and "--ps-market" in err
