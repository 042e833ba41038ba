"""Importers on the real shared files: idempotent, transactional, bad input gives one-line errors."""

from __future__ import annotations

import shutil

import pytest
from measure_testdata import CMDARE_DIR, LIFETIME_CSV, LIFETIME_JSON

from cmdare.errors import DataFormatError, DataNotFoundError
from cmdare.measure.importers.cmdare_data import import_cmdare_dir
from cmdare.measure.importers.lifetimes import import_lifetimes, read_lifetimes_file
from cmdare.measure.importers.tensorboard_import import import_tensorboard
from cmdare.measure.store import open_store


@pytest.fixture(scope="module")
def store(module_db_url):
    s = open_store(module_db_url)
    yield s
    s.close()


def test_cmdare_import_reads_every_file_and_is_idempotent(store):
    first = import_cmdare_dir(store, CMDARE_DIR)
    counts = store.counts()
    assert counts["speed_samples"] == 2 * 16 * 13 + 208  # 0latency_data (2 GPUs x 16 CNNs x 13) + supertable
    assert counts["checkpoints"] == 100
    assert counts["servers"] == 100  # startup phases: 8 files
    assert counts["chief_rejoin_points"] > 50
    assert counts["cluster_speed_samples"] > 3000
    reasons = first.reasons()
    assert reasons["duplicate of speed_data/0latency_data.csv (K80 rows)"] == 208
    assert first.read == first.imported + first.skipped  # every row accounted for
    speed = store.frame("speed_samples")
    assert speed.model_name.notna().all()  # the unnamed supertable rows get names via #params
    assert set(speed.gpu_type) == {"k80", "p100"}
    again = import_cmdare_dir(store, CMDARE_DIR)
    assert again.imported == 0 and store.counts() == counts
    assert {f.status for f in again.files} <= {"already imported", "skipped"}


def test_lifetime_import_both_formats_and_idempotent(store):
    res = import_lifetimes(store, [LIFETIME_CSV, LIFETIME_JSON])
    df = store.frame("lifetime_observations")
    assert (df.source == "hpdc2020-gce-cpu").sum() == 1442
    gpu = df[df.server_type.isin(["k80", "p100", "v100"])]
    assert set(gpu.server_type) == {"k80", "p100", "v100"}
    assert gpu.zone.notna().all() and gpu.idle.any() and (~gpu.idle).any()
    assert gpu.lifetime_s.max() < 25 * 3600  # preemptible VMs live at most ~24 h
    cpu = df[df.server_type == "cpu"]
    assert (~cpu.preempted).sum() == 725  # stopped by the experimenters: censored
    assert res.read == res.imported + res.skipped
    n = store.count("lifetime_observations")
    assert import_lifetimes(store, [LIFETIME_JSON]).imported == 0
    assert store.count("lifetime_observations") == n


def test_spreadsheet_serial_times_are_decoded():
    obs = read_lifetimes_file(LIFETIME_CSV).rows["lifetime_observations"]
    assert all(0 < o["lifetime_s"] < 25 * 3600 for o in obs)
    assert sum(o["server_type"] == "unlabeled" for o in obs) > 300


def test_missing_file_and_dir_errors(store, tmp_path):
    before = store.counts()
    with pytest.raises(DataNotFoundError, match="not found"):
        import_lifetimes(store, [tmp_path / "none.csv"])
    with pytest.raises(DataNotFoundError, match="not found"):
        import_cmdare_dir(store, tmp_path / "none")
    with pytest.raises(DataNotFoundError):
        import_tensorboard(store, tmp_path / "none.csv", "r1")
    assert store.counts() == before


def test_wrong_columns_roll_back_the_whole_import(store, tmp_path):
    """A broken file in the middle of a directory import leaves the store unchanged."""
    copy = tmp_path / "cmdare"
    shutil.copytree(CMDARE_DIR, copy)
    (copy / "startup_time" / "pre_east" / "vm_time_measure_k80_pre_east.csv").write_text("Foo,Bar\n1,2\n")
    before = store.counts()
    with pytest.raises(DataFormatError, match="missing column") as err:
        import_cmdare_dir(store, copy)
    assert "\n" not in str(err.value)
    assert store.counts() == before
    bad = tmp_path / "speed.csv"
    bad.write_text("time,speed\n1,2\n")
    with pytest.raises(DataFormatError, match="Wall time"):
        import_tensorboard(store, bad, "r1")
    assert store.counts() == before


def test_truncated_json_is_a_one_line_error(store, tmp_path):
    trunc = tmp_path / "trunc.json"
    trunc.write_bytes(LIFETIME_JSON.read_bytes()[:50_000])
    before = store.counts()
    with pytest.raises(DataFormatError, match="truncated") as err:
        import_lifetimes(store, [LIFETIME_CSV, trunc])  # the good file is not kept either
    assert "\n" not in str(err.value)
    assert store.counts() == before


def test_malformed_rows_are_reported_not_dropped(store, tmp_path):
    f = tmp_path / "run_.-tag-global_step_sec.csv"
    f.write_text("Wall time,Step,Value\n1.0,100,5.0\nbad,,x\n2.0,200,6.0\n3.0,300,\n")
    res = import_tensorboard(store, f, "tb-run", workers=2, gpu_type="k80")
    assert (res.read, res.skipped) == (4, 2)
    assert res.reasons()["missing or non-numeric Step/Value"] == 2
    assert res.imported == 4  # 2 points x (step metric + cluster speed sample)
    runs = store.frame("runs")
    assert "tb-run" in set(runs.run_id)


def test_unknown_lifetime_layout(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(DataFormatError, match="unknown lifetime format"):
        read_lifetimes_file(f)
    plain = tmp_path / "plain.csv"
    plain.write_text("lifetime_s,preempted,server_type\n100,true,t4\n200,false,t4\n-5,true,t4\n")
    pf = read_lifetimes_file(plain)
    assert pf.read == 3 and sum(pf.skipped.values()) == 1
    assert [o["preempted"] for o in pf.rows["lifetime_observations"]] == [True, False]
