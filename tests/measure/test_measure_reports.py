"""Reports on the imported public data reproduce the published shapes; plots are written."""

from __future__ import annotations

import json

import pytest
from measure_testdata import CMDARE_DIR, LIFETIME_CSV, LIFETIME_JSON

from cmdare.errors import DataNotFoundError, UnknownNameError
from cmdare.measure.importers.cmdare_data import import_cmdare_dir
from cmdare.measure.importers.lifetimes import import_lifetimes
from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.reports import REPORTS, build_report
from cmdare.measure.store import open_store
from cmdare.train.callbacks import CheckpointReport, EventReport, RunInfo, RunSummary, ShardReport, StepReport


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"sqlite:///{tmp_path_factory.mktemp('rep') / 'cmdare.db'}")
    import_cmdare_dir(s, CMDARE_DIR)
    import_lifetimes(s, [LIFETIME_CSV, LIFETIME_JSON])
    return s


@pytest.fixture(scope="module")
def reports(store):
    """Each public-data report built once per module (the lifetime fits take a few seconds)."""
    return {name: build_report(name, store) for name in ("lifetimes", "scaling", "startup", "checkpoint")}


def test_scaling_k80_near_linear_p100_flattens(reports):
    rep = reports["scaling"]
    both = rep.tables["saturation"]
    sat = both[both.ps == 1].set_index(["gpu_type", "model"])
    all_speeds = rep.tables["speeds"]
    speeds = all_speeds[all_speeds.ps == 1]
    for model in ("res15", "res32", "shakesmall", "shakebig"):
        k80 = sat.loc[("k80", model)]
        assert k80.max_workers == 8 and k80.efficiency_at_max > 0.9, model  # near-linear to 8 workers
        assert k80.ps_saturates_at is None or k80.ps_saturates_at != k80.ps_saturates_at
        p100 = sat.loc[("p100", model)]
        assert p100.ps_saturates_at in (4, 5), model  # 1 PS flattens around 4-5 workers
        assert p100.efficiency_at_max < 0.7, model
    res15 = speeds[(speeds.gpu_type == "p100") & (speeds.model == "res15")].set_index("workers").steps_per_s
    assert res15[8] / res15[5] < 1.2  # adding 3 more workers past the knee adds little
    assert all(0 < e < 1.2 for e in speeds.efficiency)
    # CM-DARE's P100 runs with 2 PS: a 2nd PS lifts ResNet-15 at 8 workers (176.5 against 108.9 steps/s)
    two = all_speeds[(all_speeds.ps == 2) & (all_speeds.gpu_type == "p100") & (all_speeds.model == "res15")]
    assert sorted(two.workers) == list(range(1, 9))
    assert two.set_index("workers").steps_per_s[8] > 1.4 * res15[8]
    assert set(both[both.ps == 2].gpu_type) == {"p100"}


def test_startup_preemptible_slower_mainly_in_staging(reports):
    rep = reports["startup"]
    t = rep.tables["by_market"].set_index(["gpu_type", "market"])
    for gpu in ("k80", "p100"):
        pre, od = t.loc[(gpu, "transient")], t.loc[(gpu, "on-demand")]
        assert pre.total_s > od.total_s
        diffs = {p: pre[p] - od[p] for p in ("provisioning_s", "staging_s", "booting_s")}
        assert max(diffs, key=lambda k: abs(diffs[k])) == "staging_s"
        assert diffs["staging_s"] > 10
    assert any("staging" in n for n in rep.notes)


def test_checkpoint_duration_grows_with_size(reports):
    rep = reports["checkpoint"]
    fits = rep.tables["fits"].set_index("duration")
    assert fits.loc["remote_duration_s", "s_per_mb"] > 0 and fits.loc["local_duration_s", "s_per_mb"] > 0
    assert fits.loc["remote_duration_s", "intercept_s"] > fits.loc["local_duration_s", "intercept_s"]
    assert fits.loc["remote_duration_s", "mape"] < 0.10  # published linear fit: 7.98%
    assert len(rep.tables["by_model"]) == 20


def test_lifetime_report_fractions_and_fits(reports):
    rep = reports["lifetimes"]
    summary = rep.tables["summary"].set_index(["server_type", "region"])
    cpu = summary.loc[("cpu", "all")]
    assert cpu.servers == 1442 and 0 < cpu.revoked_within_1h < cpu.revoked_before_24h < 1
    for gpu in ("k80", "p100", "v100"):
        assert 0 <= summary.loc[(gpu, "all")].revoked_before_24h < 0.6
    fits = rep.tables["fits"].set_index("server_type")
    assert (fits.bathtub_ks < fits.exponential_ks).all()  # a 24 h deadline is not memoryless
    assert rep.tables["by_hour"].shape[1] == 25


@pytest.mark.parametrize("name", ["lifetimes", "scaling", "startup", "checkpoint"])
def test_every_report_renders_and_plots(reports, tmp_path, name):
    rep = reports[name]
    png = rep.save_plot(tmp_path / f"{name}.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    doc = json.loads(rep.render("json"))
    assert doc["report"] == name and doc["tables"]
    main = next(iter(rep.tables))
    assert rep.render("csv", main).splitlines()[0] == ",".join(rep.main.columns)
    csv_text = rep.render("csv")  # every table (issue 30: csv had only the first), each under its name
    assert [ln[2:] for ln in csv_text.splitlines() if ln.startswith("# ")] == \
        (list(rep.tables) if len(rep.tables) > 1 else [])
    for name_, df in rep.tables.items():
        assert ",".join(df.columns) in csv_text and f"{rep.title}: {name_}" in rep.render("table") or \
            len(rep.tables) == 1
    assert rep.title in rep.render("table")


def test_run_report_marks_events_and_cost(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'run.db'}")
    rec = StoreRecorder(store, batch_size=10)
    t0 = 1.8e9
    rec.on_run_start(RunInfo("run-x", {"model": "resnet15", "dataset": "digits"}, t0))
    for i in range(60):
        rec.on_step(StepReport("run-x", t0 + i, i * 2, i % 2, 2, 1.0, 1.0, 2.0 if i < 30 else 1.0))
    rec.on_event(
        EventReport("run-x", t0 + 30, "revocation", 60, 1, None, "w1", {"price_per_hour_usd": 0.36, "joined_at": t0})
    )
    rec.on_event(EventReport("run-x", t0 + 45, "replacement_joined", 90, 1, None, "w2", {"price_per_hour_usd": 0.36}))
    rec.on_checkpoint(CheckpointReport("run-x", t0 + 40, 80, 0, "/c", 1000, 0.1))
    for k in range(2):  # two load windows per shard; shard 1 is the slow one
        for t in (10, 20):
            rec.on_shard(ShardReport("run-x", t0 + t, t * 2, k, 50, 2_000_000, 2_000_000, 0.5 * (1 + 2 * k), 1000,
                                     apply_s=0.1, queue_s=0.05 * (1 + k), wait_s=1.0 * (1 + 2 * k)))
    rec.on_run_end(RunSummary("run-x", t0 + 60, "finished", 120, 60.0, 2.0, 0.9, 0.1, 1, 1))
    rec.close()
    rep = build_report("run", store, run_id="run-x")
    summary = dict(zip(rep.tables["summary"].field, rep.tables["summary"].value, strict=True))
    assert summary["revocations"] == "1" and summary["replacements"] == "1" and summary["checkpoints"] == "1"
    assert float(summary["cost_usd"]) == pytest.approx(0.36 * (30 + 15) / 3600, rel=1e-6)
    assert len(rep.tables["timeline"]) > 5
    assert set(rep.tables["events"].kind) == {"revocation", "replacement_joined"}
    shards = rep.tables["shards"].set_index("shard_id")
    assert shards.pushes.tolist() == [100, 100] and shards.mb_in.tolist() == [4.0, 4.0]
    assert shards.service_ms.tolist() == [10.0, 30.0] and shards.queue_ms.tolist() == [1.0, 2.0]
    assert shards.wait_ms.tolist() == [20.0, 60.0]
    assert rep.save_plot(tmp_path / "run.png").stat().st_size > 5_000
    with pytest.raises(DataNotFoundError, match="recent runs: run-x"):
        build_report("run", store, run_id="nope")


def test_empty_store_says_which_import_to_run(tmp_path):
    empty = open_store(f"sqlite:///{tmp_path / 'empty.db'}")
    for name, hint in (
        ("lifetimes", "cmdare import lifetimes"),
        ("scaling", "cmdare import cmdare"),
        ("startup", "cmdare import cmdare"),
        ("checkpoint", "cmdare import cmdare"),
    ):
        with pytest.raises(DataNotFoundError, match=hint):
            build_report(name, empty)
    with pytest.raises(UnknownNameError, match="valid: " + ", ".join(REPORTS)):
        build_report("nope", empty)
