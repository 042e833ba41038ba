"""Public API of cmdare.predict: workloads, data discovery, persistence, startup and recovery."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import cmdare.predict as P
from cmdare.errors import DataFormatError, UnknownNameError, UserInputError
from cmdare.predict import data, persist
from cmdare.predict.startup import PHASES, StartupModel


def _clear_model_caches() -> None:
    for name in dir(P):
        fn = getattr(P, name)
        if callable(getattr(fn, "cache_clear", None)):
            fn.cache_clear()


@pytest.fixture(autouse=True, scope="module")
def _fresh_models(tmp_path_factory):
    """Models fitted earlier in the session (under another CMDARE_HOME) are forgotten, so this
    module's cache files land in its own models directory."""
    old = os.environ.get("CMDARE_HOME")
    os.environ["CMDARE_HOME"] = str(tmp_path_factory.getbasetemp() / "cmdare_home")
    _clear_model_caches()
    yield
    _clear_model_caches()
    if old is None:
        os.environ.pop("CMDARE_HOME", None)
    else:
        os.environ["CMDARE_HOME"] = old


@pytest.fixture(autouse=True)
def _home(tmp_path_factory, monkeypatch):
    # One models directory for the whole module, so fitted models are cached once.
    home = tmp_path_factory.getbasetemp() / "cmdare_home"
    monkeypatch.setenv("CMDARE_HOME", str(home))


def test_public_api_is_pinned():
    assert set(P.__all__) == {
        "PS_MODEL_LINK_GBPS",
        "WorkloadFeatures",
        "checkpoint_model",
        "cluster_speed_model",
        "fit_from_store",
        "gpu_tflops",
        "list_published_workloads",
        "predict_checkpoint_s",
        "predict_cluster_steps_per_s",
        "predict_step_time_s",
        "published_workload",
        "recovery_time_published_s",
        "recovery_time_s",
        "startup_model",
        "step_flops",
        "step_time_model",
    }


def test_published_workloads_and_aliases():
    names = P.list_published_workloads()
    assert len(names) == 16 and {"Res15", "Res32", "shakebig", "custom8"} <= set(names)
    assert P.published_workload("t2t_resnet32").name == "Res32"
    assert P.published_workload("Res15").name == P.published_workload("t2t_resnet15").name == "Res15"
    w = P.published_workload("shakebig")
    assert w.num_tensors == 216 and w.num_params == 26204362
    # avg tensor size derived from #params/#tensors matches the data's column exactly
    assert w.avg_tensor_mb == pytest.approx(0.462785686, rel=1e-6)
    with pytest.raises(UnknownNameError, match="Res32"):
        P.published_workload("resnet1000")


def test_loaders_have_no_missing_features():
    single = data.load_single_gpu_speed()
    assert len(single) == 416 and single["Number of Tensors"].notna().all()
    cluster = data.load_cluster_speed()
    assert len(cluster) == 64 and set(cluster["Workers"]) == set(range(1, 9))
    startup = data.load_startup()
    assert set(startup["region"]) == {"east", "west"} and set(startup["transient"]) == {True, False}


def test_step_time_predictions_are_physical():
    k80 = P.predict_step_time_s("t2t_resnet32", "k80", batch_size=128)  # CM-DARE measured at T2T's batch, 128
    p100 = P.predict_step_time_s("t2t_resnet32", "p100", batch_size=128)
    v100 = P.predict_step_time_s("t2t_resnet32", "v100", batch_size=128)
    assert k80 == pytest.approx(0.2179, rel=0.07)  # measured mean 0.218 s
    assert v100 < p100 < k80
    assert P.predict_step_time_s("t2t_resnet32", "k80", latency_ms=30.3, batch_size=128) > k80
    assert P.predict_step_time_s("t2t_resnet32", 4.113, batch_size=128) == pytest.approx(k80)
    with pytest.raises(UnknownNameError):
        P.predict_step_time_s("t2t_resnet32", "x9000")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(UserInputError):
            P.predict_step_time_s("t2t_resnet32", bad)


def test_cluster_speed_ps_capacity_mixed_gpus_and_more_ps():
    one = [P.predict_cluster_steps_per_s("t2t_resnet15", {"p100": n}, 1) for n in range(1, 13)]
    assert all(b >= a for a, b in zip(one, one[1:], strict=False))
    assert one[11] - one[7] < 0.1 * one[7]  # saturated: P100 + 1 PS flattens
    assert 90 <= one[7] <= 115  # measured 104.7 at 8 workers
    two = P.predict_cluster_steps_per_s("t2t_resnet15", {"p100": 8}, 2)
    assert two > 1.3 * one[7]  # a second PS lifts the ceiling (published ~177 at 8 workers)
    k80 = P.predict_cluster_steps_per_s("t2t_resnet32", {"k80": 4}, 1)
    mixed = P.predict_cluster_steps_per_s("t2t_resnet32", "k80:4,p100:2", 1)
    p100 = P.predict_cluster_steps_per_s("t2t_resnet32", ["p100"] * 2, 1)
    assert k80 < mixed < k80 + p100 + 1e-9
    with pytest.raises(UserInputError):
        P.predict_cluster_steps_per_s("t2t_resnet32", {"k80": 2}, 0)


def test_checkpoint_predictions_and_cache_roundtrip():
    small = P.predict_checkpoint_s(6.27e6, 50, remote=True)
    big = P.predict_checkpoint_s(204e6, 216, remote=True)
    assert 3.2 < small < 4.3 and 6.8 < big < 8.5  # whole_data.csv means: 3.79 and 7.67 s
    assert P.predict_checkpoint_s(6.27e6) < small  # local is faster than save + upload
    assert P.predict_checkpoint_s(2e9, remote=True) > big  # extrapolates upwards, not flat
    with pytest.raises(UserInputError):
        P.predict_checkpoint_s(0)
    cache = P._cache_dir()
    meta = json.loads((cache / "checkpoint_remote.json.meta.json").read_text())
    assert meta["data_fingerprint"] == P._fingerprint() and meta["rows"] == 100
    loaded = persist.load_model(cache / "checkpoint_remote.json", P._fingerprint())
    X = np.array([[6.27, 50.0], [204.0, np.nan]])
    # promised exactly (predict/checkpoint.py): the JSON keeps the training rows, the model is rebuilt by refitting
    np.testing.assert_array_equal(loaded.predict(X), P.checkpoint_model(True).predict(X))
    assert persist.load_model(cache / "checkpoint_remote.json", "other-fingerprint") is None


def test_json_models_roundtrip():
    for name in ("step_time", "cluster_speed"):
        P.step_time_model(), P.cluster_speed_model()
        path = P._cache_dir() / f"{name}.json"
        payload = json.loads(path.read_text())
        assert payload["class"] in ("StepTimeModel", "PSQueueModel")
        loaded = persist.load_json_model(path)
        original = P.step_time_model() if name == "step_time" else P.cluster_speed_model()
        X = (
            np.array([[4.113, 1.66e9, 1.86e6, 104, 0.3]])
            if name == "step_time"
            else np.array([[0.04, 693818, 50, 6, 1]])
        )
        assert np.allclose(loaded.predict(X), original.predict(X))


def test_foreign_or_malformed_model_files_are_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"class": "os.system", "params": {}, "fitted": {}}))
    with pytest.raises(DataFormatError, match="unknown model class"):
        persist.load_json_model(bad)
    bad.write_text(json.dumps({"class": "StepTimeModel", "params": {"evil": 1}, "fitted": {}}))
    with pytest.raises(DataFormatError, match="not a valid"):
        persist.load_json_model(bad)
    bad.write_text(json.dumps({"class": "PSQueueModel", "params": {}, "fitted": {"__class__": 1}}))
    with pytest.raises(DataFormatError, match="not a fitted attribute"):
        persist.load_json_model(bad)
    # a cache file that cannot be read is refitted, never trusted
    (tmp_path / "x.json").write_text("{")
    (tmp_path / "x.json.meta.json").write_text(json.dumps({"model_version": persist.MODEL_VERSION}))
    with pytest.raises(json.JSONDecodeError):
        persist.load_model(tmp_path / "x.json")


def test_startup_model_groups_fallbacks_and_json():
    model = P.startup_model()
    rng = np.random.default_rng(0)
    draws = [model.sample(rng, "k80", True, "east") for _ in range(400)]
    assert set(draws[0]) == set(PHASES)
    staging = np.mean([d["Staging"] for d in draws])
    measured = data.load_startup()
    ref = measured[(measured.gpu == "K80") & measured.transient & (measured.region == "east")]["Staging"].mean()
    assert staging == pytest.approx(ref, rel=0.1)
    # preemptible staging is slower than on-demand (CM-DARE's finding)
    assert model.mean_s("p100", True)["Staging"] > model.mean_s("p100", False)["Staging"] + 10
    assert model.mean_s("h100", True)["Staging"] > 0  # unknown GPU: pooled fit
    again = StartupModel.from_json(json.loads(json.dumps(model.to_json())))
    assert again.mean_s("k80", False, "west") == pytest.approx(model.mean_s("k80", False, "west"))


def test_recovery_formulas():
    # Published: o + (S - s)/v_new - o * v_cur / v_new
    t = P.recovery_time_published_s(64000, 32000, v_cur=30, v_new=36, overhead_s=100)
    assert t == pytest.approx(100 + 32000 / 36 - 100 * 30 / 36)
    # cmdare's form with no warm-up and no restore equals the published one
    assert P.recovery_time_s(64000, 32000, 30, 36, 100, warmup_s=0) == pytest.approx(t)
    assert P.recovery_time_s(64000, 32000, 30, 36, 100, warmup_s=60) > t
    # the run finishes before the replacement arrives (100 steps at 10/s): the published formula
    # still charges the whole overhead
    assert P.recovery_time_s(1000, 900, 10, 20, 100, warmup_s=0) == pytest.approx(10.0)
    assert P.recovery_time_published_s(1000, 900, 10, 20, 100) == pytest.approx(55.0)
    with pytest.raises(UserInputError):
        P.recovery_time_s(10, 20, 1, 1, 1)


def test_fit_from_store_adds_own_checkpoints_and_servers(tmp_path):
    from cmdare.measure.store.repository import open_store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    # cmdare's own run: a much slower bucket than CM-DARE's, so the refit visibly moves
    store.insert_rows(
        "checkpoints",
        [
            {
                "run_id": "r1",
                "size_bytes": int(500e6),
                "num_tensors": 300,
                "local_duration_s": 2.0,
                "remote_duration_s": 30.0 + i,
                "source": "cmdare",
            }
            for i in range(5)
        ]
        + [
            {
                "run_id": None,
                "size_bytes": int(6.27e6),
                "num_tensors": 50,
                "local_duration_s": 0.2,
                "remote_duration_s": 99.0,
                "source": "cmdare:checkpoint",
            }
        ],
    )  # public import: ignored
    store.insert_rows(
        "servers",
        [
            {
                "server_id": f"s{i}",
                "gpu_type": "t4",
                "region": "us-central1",
                "transient": True,
                "provisioning_s": 3.0,
                "staging_s": 100.0 + i,
                "booting_s": 50.0,
                "source": "cmdare",
            }
            for i in range(6)
        ],
    )
    store.insert_rows(  # an emulated server: its phases came from the startup model itself, never refit on
        "servers",
        [
            {
                "server_id": "emulated",
                "gpu_type": "t4",
                "region": "us-central1",
                "transient": True,
                "provisioning_s": 3.0,
                "staging_s": 5000.0,
                "booting_s": 50.0,
                "source": "cmdare",
                "emulated": True,
            }
        ],
    )
    store.close()
    before = P.predict_checkpoint_s(500e6, 300, remote=True)
    staging_before = P.startup_model().mean_s("t4", True, "us-central1")["Staging"]
    used = P.fit_from_store(url)
    assert {k: used[k] for k in ("checkpoints", "servers", "runs")} == {"checkpoints": 5, "servers": 6, "runs": 0}
    assert used["speed"]["gpus"] == {}  # no training runs in this store: no speed correction
    after = P.predict_checkpoint_s(500e6, 300, remote=True)
    assert after > before + 5
    assert P.predict_checkpoint_s(6.27e6, 50, remote=True) < 5  # the public-import row was skipped
    # 6 own samples at ~102 s, partially pooled with the preemptible fit (~45 s)
    assert P.startup_model().mean_s("t4", True, "us-central1")["Staging"] > staging_before + 20
    assert P.startup_model().mean_s("k80", True, "us-east1") == P.startup_model().mean_s("k80", True, "east")
    meta = json.loads((P._cache_dir() / "startup.json.meta.json").read_text())
    assert meta["base_fingerprint"] == P._fingerprint() and meta["store_rows"]["servers"] == 6
    # a fresh process would load the store-extended models, not refit them from the CSVs
    assert persist.load_model(P._cache_dir() / "checkpoint_remote.json", P._fingerprint()) is not None
    # back to the public data only, for the other tests
    import shutil

    shutil.rmtree(P._cache_dir())
    P.checkpoint_model.cache_clear()
    P.startup_model.cache_clear()


def test_mva_exact_and_large_cluster_approximation():
    from cmdare.predict.cluster_speed import _schweitzer_throughput, mva_throughput

    # one worker never queues: speed = 1 / (think + demand)
    assert mva_throughput([0.03], [1], 0.01) == pytest.approx(25.0)
    # saturation at 1 / demand
    assert mva_throughput([0.03], [200], 0.01) == pytest.approx(100.0, rel=1e-3)
    exact = mva_throughput([0.03, 0.1], [30, 30], 0.0096)
    assert _schweitzer_throughput([0.03, 0.1], [30, 30], 0.0096) == pytest.approx(exact, rel=0.03)
    big = mva_throughput([0.2, 0.08, 0.05], [100, 100, 100], 0.01)  # its latency: bench/mva_latency.py
    assert big == pytest.approx(100.0, rel=0.01)


@pytest.mark.parametrize(("column", "value", "kind"), [
    ("Number of Tensors", "1e308", "step"),  # grew to 7.8 GB in 114 s before issue 29
    ("Model FLOPs", "1e300", "step"),
    ("Number of Parameters", "1e200", "step"),
    ("Checkpoint Size (MB)", "1e300", "checkpoint"),
])
def test_unbounded_feature_values_are_refused_in_one_line(column, value, kind):
    import pandas as pd

    from cmdare.errors import DataFormatError
    from cmdare.predict.features import table_features

    row = {"GPU TFLOPS": "4.1", "Model FLOPs": "1e9", "Number of Parameters": "1e6", "Number of Tensors": "60",
           "Checkpoint Size (MB)": "10"}
    row[column] = value
    with pytest.raises(DataFormatError, match=re.escape(f"row 1, column '{column}': {value} is beyond the largest")):
        table_features(pd.DataFrame([row]), kind)


def test_a_derived_tensor_count_is_bounded_too():
    import pandas as pd

    from cmdare.errors import DataFormatError
    from cmdare.predict.features import table_features

    with pytest.raises(DataFormatError, match="tensors, beyond the largest value"):  # params / average size
        table_features(pd.DataFrame([{"GPU TFLOPS": "4", "Model FLOPs": "1e9", "Number of Parameters": "1e12",
                                      "Average Tensor Size (MB)": "1e-6"}]), "step")


def test_one_name_one_network_in_predict_and_train():
    """Issue 30: ``resnet32`` trained He's 464,154-parameter CIFAR ResNet but predicted and planned T2T's
    1,857,722-parameter one; ``t2t_resnet32`` was refused by predict."""
    from cmdare.predict.workloads import workload_features
    from cmdare.workloads import profile_model

    for name in ("resnet32", "resnet15", "resnet56", "custom_resnet10"):  # not measured: from the profile
        w = workload_features(name)
        assert not w.measured and "extrapolate" in w.source
        assert (w.num_params, w.num_tensors) == (profile_model(name).num_params, profile_model(name).num_tensors)
    for zoo, data_name in (("t2t_resnet32", "Res32"), ("shake_shake_large", "shakebig"), ("custom_resnet4", "custom4")):
        w = workload_features(zoo)
        assert w.measured and w.name == data_name and w.num_params == profile_model(zoo).num_params
    with pytest.raises(UnknownNameError):
        P.published_workload("resnet32")  # He's ResNet-32 was never measured
    assert P.predict_step_time_s("resnet32", "k80") < P.predict_step_time_s("t2t_resnet32", "k80")
    from cmdare.train.run.gpu_speeds import step_time_s

    assert step_time_s("resnet32", "k80") == P.predict_step_time_s("resnet32", "k80")  # train emulates the same
