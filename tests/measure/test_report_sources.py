"""Reports say where their rows come from: no size-duration fit through one checkpoint size, and
emulated servers' startup phases are labelled and never mixed with the public GCE measurements."""

from __future__ import annotations

import json

import pytest
from measure_testdata import CMDARE_DIR
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from cmdare.measure.importers.cmdare_data import import_cmdare_dir
from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.reports import build_report
from cmdare.measure.store import open_store
from cmdare.measure.store.repository import _alembic_config
from cmdare.train.callbacks import CheckpointReport, RunInfo

RUN = "run-ckpt"
ONE_SIZE = "one checkpoint size only"


def _checkpoint_store(url: str, sizes: list[int]) -> None:
    """A store holding only ``RUN``'s checkpoints (durations vary, sizes as given)."""
    rec = StoreRecorder(open_store(url), batch_size=100)
    rec.on_run_start(RunInfo(RUN, {"model": "resnet8", "dataset": "digits"}, 1.8e9))
    for i, size in enumerate(sizes):
        rec.on_checkpoint(CheckpointReport(RUN, 1.8e9 + i, 10 * i, 0, f"/ck/{i}", size, 0.1 + 0.05 * (i % 3), 12))
    rec.close()


# A run's checkpoints are one size: identical bytes, or a few bytes apart (the step in the metadata).
SAME_SIZES = {"identical": [1_200_000] * 5, "bytes apart": [1_200_345, 1_200_346, 1_200_347, 1_200_347, 1_200_348]}


@pytest.mark.parametrize("sizes", SAME_SIZES.values(), ids=SAME_SIZES.keys())
def test_checkpoint_report_does_not_fit_one_size(tmp_path, sizes):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _checkpoint_store(url, sizes)
    rep = build_report("checkpoint", open_store(url), run_id=RUN)
    fits = rep.tables["fits"].set_index("duration")
    local = fits.loc["local_duration_s"]
    assert local.points == 5 and local.sizes == 1
    assert local[["intercept_s", "s_per_mb", "mape"]].isna().all()
    assert ONE_SIZE in local.note and "mean duration 0.14 s" in local.note
    assert any(ONE_SIZE in n and "1.14 MB" in n and "no size-duration fit" in n for n in rep.notes), rep.notes
    assert not any("ms/MB" in n for n in rep.notes)


def test_checkpoint_report_cli_says_no_fit(tmp_path):
    from cmdare.cli import app

    url = f"sqlite:///{tmp_path / 'c.db'}"
    _checkpoint_store(url, SAME_SIZES["bytes apart"])
    res = CliRunner().invoke(app, ["report", "checkpoint", "--run", RUN, "--db", url])
    assert res.exit_code == 0, res.output
    assert ONE_SIZE in res.output and "no size-duration fit" in res.output and "ms/MB" not in res.output
    res = CliRunner().invoke(app, ["report", "checkpoint", "--run", RUN, "--db", url, "--format", "json"])
    doc = json.loads(res.output)
    (local,) = doc["tables"]["fits"]
    assert local["s_per_mb"] is None and local["intercept_s"] is None and ONE_SIZE in local["note"]


def test_checkpoint_report_fits_two_sizes(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _checkpoint_store(url, [1_000_000, 1_000_000, 2_000_000, 2_000_000, 3_000_000])
    fits = build_report("checkpoint", open_store(url), run_id=RUN).tables["fits"].set_index("duration")
    assert fits.loc["local_duration_s", "sizes"] == 3 and fits.loc["local_duration_s", "s_per_mb"] == fits.loc[
        "local_duration_s", "s_per_mb"]  # fitted (not NaN)


def test_servers_emulated_column_migrates_with_backfill(tmp_path):
    """0003 adds servers.emulated: False for old rows, True for servers of runs recorded as emulated."""
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        conn.execute(text("INSERT INTO runs (run_id, config, status, code_version, emulated, resumed_from_step, "
                          "source) VALUES ('r-emu', '{}', 'finished', '', 1, 0, 'cmdare'), "
                          "('r-real', '{}', 'finished', '', 0, 0, 'cmdare')"))
        conn.execute(text("INSERT INTO servers (server_id, run_id, role, transient, source) VALUES "
                          "('a', 'r-emu', 'worker', 1, 'cmdare'), ('b', 'r-real', 'worker', 1, 'cmdare'), "
                          "('c', NULL, 'worker', 1, 'cmdare:startup')"))
    engine.dispose()
    servers = open_store(url).frame("servers").set_index("server_id").emulated.astype(bool).to_dict()
    assert servers == {"a": True, "b": False, "c": False}


@pytest.mark.cluster  # make test-cluster: a real run with replacements, then its report
def test_startup_report_keeps_emulated_servers_apart(local_ray, tmp_path):
    from cmdare.ps.optimizer import OptimizerConfig
    from cmdare.train import Trainer, TrainSpec

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    import_cmdare_dir(store, CMDARE_DIR)
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=10, batch_size=16, chunk_steps=5,
                     optimizer=OptimizerConfig(lr=0.05), checkpoint_every=0, eval_every=0, seed=1,
                     transient=True, gpu="k80", revocations="none", startup="model")
    summary = Trainer(spec, [StoreRecorder(store)], run_id="run-emu", checkpoint_dir=tmp_path / "ck").run()
    assert summary.status == "finished"
    servers = store.frame("servers")
    own = servers[servers.run_id == "run-emu"]
    assert len(own) == 3 and own.emulated.astype(bool).all()
    assert not servers[servers.run_id.isna()].emulated.astype(bool).any()

    rep = build_report("startup", store)
    for name in ("by_market", "by_region"):
        t = rep.tables[name]
        assert set(t.source) == {"public GCE measurement (CM-DARE)", "cmdare run (emulated)"}, name
        emu = t[t.source == "cmdare run (emulated)"]
        assert emu.servers.sum() == 2  # the two worker servers (the PS server has no phases)
        assert (emu.gpu_type == "k80").all() and (emu.market == "transient").all()
        public = t[t.source == "public GCE measurement (CM-DARE)"]
        assert public.servers.sum() == len(servers[servers.run_id.isna()])  # no emulated row merged in
    assert any("emulated" in n and "startup model" in n for n in rep.notes), rep.notes
    # the public comparison notes are about the public rows only
    assert all("transient startup" not in n or "public GCE" in n for n in rep.notes), rep.notes
    assert "cmdare run (emulated)" in rep.render("table")
    assert rep.save_plot(tmp_path / "startup.png").stat().st_size > 5_000

    run = build_report("run", store, run_id="run-emu")
    summary_tbl = dict(zip(run.tables["summary"].field, run.tables["summary"].value, strict=True))
    assert summary_tbl["emulated"] == "True" and summary_tbl["emulated_servers"] == "3"
    assert any("emulated" in n for n in run.notes), run.notes


def test_scaling_report_marks_emulated_runs(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'sc.db'}")
    rec = StoreRecorder(store)
    rec.on_run_start(RunInfo("run-emu", {"model": "resnet8"}, 1.8e9, emulated=True))
    rec.close()
    store.insert_rows("cluster_speed_samples", [
        {"source": "tensorboard", "run_id": "run-emu", "gpu_type": "k80", "model_name": None, "workers": w, "ps": 1,
         "step": 10 * i, "wall_time": 1.8e9 + i, "steps_per_s": 5.0 * w} for w in (1, 2) for i in range(6)])
    rep = build_report("scaling", store)
    assert set(rep.tables["speeds"].model) == {"run-emu (emulated)"}
    assert any("emulated servers" in n for n in rep.notes), rep.notes
