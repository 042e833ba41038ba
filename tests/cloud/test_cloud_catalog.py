"""Catalog: shipped data, look-ups, user overrides and validation of malformed entries."""

from __future__ import annotations

import json
import pickle

import pytest

from cmdare.cloud import catalog as catalog_mod
from cmdare.cloud.catalog import NotOfferedError, load_catalog
from cmdare.cloud.servers import ServerSpec, cost_usd
from cmdare.errors import DataFormatError, DataNotFoundError, UnknownNameError, UserInputError

GPUS = ["K80", "P100", "V100", "T4", "L4", "A100", "H100"]


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


@pytest.fixture(autouse=True)
def _no_env_catalog(monkeypatch):
    monkeypatch.delenv("CMDARE_CATALOG", raising=False)


def test_shipped_catalog_has_every_gpu_region_and_a_source_for_every_price(cat):
    assert cat.gpu_names() == GPUS
    assert set(cat.regions("gcp")) >= {"us-central1", "us-east1", "us-west1", "europe-west4"}
    assert set(cat.regions("aws")) >= {"us-east-1", "us-west-2", "eu-west-1"}
    for o in cat.offerings:
        assert o.source.strip() and o.as_of.strip(), o.key
        assert o.on_demand_usd_per_h is not None or o.spot_usd_per_h is not None
        if o.on_demand_usd_per_h is not None and o.spot_usd_per_h is not None and not o.spot_only:
            assert o.spot_usd_per_h < o.on_demand_usd_per_h, o.key  # transient is the cheap option
    for gpu in GPUS:  # every GPU type is rentable somewhere, current ones on both clouds except P100
        clouds = {o.cloud for o in cat.find(gpu=gpu)}
        assert clouds == ({"gcp"} if gpu == "P100" else {"gcp", "aws"}), gpu
    for cloud in ("gcp", "aws"):  # a CPU-only PS server in every region
        for region in cat.regions(cloud):
            assert cat.price_per_hour_usd(None, cloud, region, transient=False) > 0


def test_gpu_facts_and_case_insensitive_lookup(cat):
    assert cat.gpu("k80").tflops_fp32 == 4.113
    assert cat.gpu("K80") is cat.gpu(" k80 ")
    assert cat.gpu("P100").tflops_fp32 == 9.526
    assert cat.gpu("v100").tflops_fp32 == 15.7
    assert catalog_mod.gpu_tflops("t4") == 8.1
    assert all(cat.gpu(g).memory_gb > 0 and cat.gpu(g).source for g in GPUS)
    with pytest.raises(UnknownNameError) as info:
        cat.gpu("x100")
    assert "x100" in str(info.value) and "K80" in str(info.value) and "H100" in str(info.value)


def test_icac2019_rates_and_replay_of_the_published_costs(cat):
    assert cat.price_per_hour_usd("k80", "gcp", "us-east1", transient=False) == 0.723
    assert cat.price_per_hour_usd("K80", "gcp", "us-east1", transient=True) == 0.256
    refs = cat.reference_rates["icac2019"]
    assert refs["cpu_ps_on_demand_usd_per_h"] == 0.143
    icac = load_catalog("icac2019")
    ps = icac.server_spec(None, "gcp", "us-east1", transient=False)
    assert ps.role == "ps" and ps.price_per_hour_usd == 0.143
    # One on-demand K80 trained ResNet-32 in ~14,080 s for ~$2.83 (design notes section 7).
    one = icac.server_spec("k80", "gcp", "us-east1", transient=False)
    assert cost_usd(one, 14_080) == pytest.approx(2.83, abs=0.01)
    # 8 preemptible K80 + 1 PS were ~7.7x faster for ~60% less money.
    t = 14_080 / 7.7
    cluster = 8 * cost_usd(icac.server_spec("k80", "gcp", "us-east1", True), t) + cost_usd(ps, t)
    assert 1 - cluster / cost_usd(one, 14_080) == pytest.approx(0.60, abs=0.03)


def test_price_lookup_errors_name_what_is_valid(cat):
    with pytest.raises(UnknownNameError) as info:
        cat.price_per_hour_usd("t4", "gcp", "mars-central1", True)
    assert "mars-central1" in str(info.value) and "us-central1" in str(info.value)
    with pytest.raises(NotOfferedError) as info:
        cat.price_per_hour_usd("p100", "aws", "us-east-1", True)
    assert "P100" in str(info.value) and "gcp" in str(info.value)
    with pytest.raises(NotOfferedError) as info:
        cat.price_per_hour_usd("L4", "aws", "eu-west-1", True)
    assert "us-east-1" in str(info.value)
    with pytest.raises(UnknownNameError):
        cat.regions("azure")
    with pytest.raises(UserInputError, match="no spot"):
        cat.price_per_hour_usd("k80", "aws", "us-east-1", True)  # no spot price recorded (P2 retired)
    err = pickle.loads(pickle.dumps(NotOfferedError("P100 servers", "aws", ["gcp"])))
    assert str(err) == "P100 servers are not offered in 'aws'; offered in: gcp"


def test_multi_gpu_servers_are_priced_per_worker_slot(cat):
    p4d = cat.offering("a100", "aws", "us-east-1")
    assert p4d.gpus_per_server == 8
    assert cat.price_per_hour_usd("a100", "aws", "us-east-1", False) == pytest.approx(p4d.on_demand_usd_per_h / 8)


def test_cheapest_is_deterministic_and_respects_filters(cat):
    best = cat.cheapest()
    assert best.transient and best.role == "worker" and best.gpu_type != "K80"  # retired types only by name
    everything = [cat.price_per_hour_usd(o.gpu, o.cloud, o.region, True)
                  for o in cat.find(role="worker", include_retired=False) if o.spot_usd_per_h is not None]
    assert best.price_per_hour_usd == min(everything)
    assert cat.cheapest(gpu="k80").gpu_type == "K80"
    aws_od = cat.cheapest(transient=False, cloud="aws")
    assert aws_od.cloud == "aws" and not aws_od.transient
    v100 = cat.cheapest(gpu="v100", transient=True)
    assert v100.price_per_hour_usd == min(cat.price_per_hour_usd("v100", o.cloud, o.region, True)
                                          for o in cat.find(gpu="v100"))
    with pytest.raises(UserInputError):
        cat.cheapest(gpu="k80", transient=True, cloud="aws")


def test_user_file_overrides_one_price_and_adds_a_gpu(tmp_path, monkeypatch):
    user = tmp_path / "mine.yaml"
    user.write_text(
        "gpus:\n"
        "  t4: {tflops_fp32: 8.0}\n"  # partial override of a shipped GPU, case-insensitive
        "  A10G: {tflops_fp32: 31.2, memory_gb: 24, source: NVIDIA A10 datasheet}\n"
        "offerings:\n"
        "  - {cloud: gcp, region: us-central1, gpu: T4, role: worker, spot_usd_per_h: 0.11, source: my quote,"
        " as_of: '2026-11-29'}\n"
        "  - {cloud: aws, region: us-east-1, gpu: A10G, machine_type: g5.xlarge, vcpus: 4, on_demand_usd_per_h: 1.006,"
        " spot_usd_per_h: 0.4, source: my quote, as_of: '2026-11-29'}\n"
    )
    mine = load_catalog(user)
    assert mine.gpu("T4").tflops_fp32 == 8.0 and mine.gpu("T4").memory_gb == 16  # other fields kept
    assert mine.price_per_hour_usd("t4", "gcp", "us-central1", True) == 0.11
    assert mine.price_per_hour_usd("t4", "gcp", "us-central1", False) == 0.54  # merged, not replaced
    assert mine.offering("t4", "gcp", "us-central1").machine_type == "n1-standard-4"
    assert mine.price_per_hour_usd("a10g", "aws", "us-east-1", True) == 0.4
    assert len(mine.offerings) == len(load_catalog().offerings) + 1
    monkeypatch.setenv("CMDARE_CATALOG", str(user))  # the environment variable does the same
    assert load_catalog().price_per_hour_usd("t4", "gcp", "us-central1", True) == 0.11
    assert catalog_mod.gpu_tflops("a10g") == 31.2
    # JSON is accepted too
    user_json = tmp_path / "mine.json"
    user_json.write_text(json.dumps({"offerings": [{"cloud": "aws", "region": "us-east-1", "gpu": None,
                                                    "role": "ps", "on_demand_usd_per_h": 0.2}]}))
    assert load_catalog(user_json).price_per_hour_usd(None, "aws", "us-east-1", False) == 0.2


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("offerings:\n  - {cloud: gcp, region: us-east1, gpu: T4, spot_usd_per_h: cheap}\n",
         ["offering #1", "gcp/us-east1/T4", "spot_usd_per_h", "cheap"]),
        ("offerings:\n  - {cloud: gcp, region: us-east1, gpu: T4, on_demand_usd_per_h: -1}\n",
         ["offering #1", "on_demand_usd_per_h", ">= 0"]),
        ("offerings:\n  - {region: us-east1, gpu: T4, spot_usd_per_h: 0.1}\n", ["offering #1", "cloud"]),
        ("offerings:\n  - {cloud: gcp, region: x, gpu: T4, spot_usd_per_h: 0.1, machine_type: n1, source: s,"
         " as_of: '2026', vcpu: 4}\n", ["offering #1", "vcpu"]),
        ("offerings:\n  - {cloud: gcp, region: x, gpu: Z9, spot_usd_per_h: 0.1}\n", ["offering #1", "gpu", "Z9"]),
        ("offerings:\n  - {cloud: azure, region: x, gpu: T4}\n", ["offering #1", "cloud", "azure"]),
        ("offerings:\n  - {cloud: gcp, region: new-region1, gpu: T4, spot_usd_per_h: 0.1, source: s, as_of: x}\n",
         ["offering #1", "gcp/new-region1/T4", "machine_type"]),
        ("gpus:\n  Z9: {tflops_fp32: 0, memory_gb: 8, source: s}\n", ["GPU 'Z9'", "tflops_fp32"]),
        ("gpus:\n  Z9: {tflops_fp32: 5}\n", ["GPU 'Z9'", "memory_gb"]),
        ("offerings: {cloud: gcp}\n", ["'offerings' must be a list"]),
        ("prices: []\n", ["unknown top-level key", "prices"]),
        ("offerings: [\n", ["cannot parse"]),
        ("- 1\n- 2\n", ["top level must be a mapping"]),
    ],
)
def test_malformed_user_entries_raise_data_format_error_naming_entry_and_field(tmp_path, text, needles):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(DataFormatError) as info:
        load_catalog(bad)
    message = str(info.value)
    assert "\n" not in message.strip() or "cannot parse" in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_missing_user_file(tmp_path):
    with pytest.raises(DataNotFoundError):
        load_catalog(tmp_path / "nope.yaml")


def test_server_spec_validation_and_per_second_cost():
    spec = ServerSpec(gpu_type="K80", cloud="gcp", region="us-east1", transient=True, price_per_hour_usd=0.256)
    assert spec.role == "worker" and spec.label == "K80 spot gcp/us-east1"
    assert cost_usd(spec, 3600) == pytest.approx(0.256)
    assert cost_usd(spec, 1.2) == pytest.approx(0.256 * 2 / 3600)  # billed per started second
    assert cost_usd(spec, 10, minimum_s=60) == pytest.approx(0.256 / 60)  # the clouds' 1-minute minimum
    assert cost_usd(spec, 0) == 0.0
    with pytest.raises(UserInputError):
        cost_usd(spec, -1)
    with pytest.raises(dataclasses_frozen_error()):
        spec.price_per_hour_usd = 1.0  # type: ignore[misc]
    bad_fields = [dict(cloud="azure"), dict(region=""), dict(price_per_hour_usd=-0.1),
                  dict(price_per_hour_usd=float("nan")), dict(role="boss"), dict(transient="yes"),
                  dict(gpu_type="")]
    base = dict(gpu_type=None, cloud="local", region="local", transient=False, price_per_hour_usd=0.0, role="ps")
    ServerSpec(**base)  # a local CPU PS is fine
    for change in bad_fields:
        with pytest.raises(UserInputError):
            ServerSpec(**(base | change))


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_public_api_is_pinned():
    import cmdare.cloud as cloud

    assert sorted(cloud.__all__) == sorted([
        "Catalog", "GpuType", "LocalMetadataServer", "Notice", "NoticeWatcher", "NotOfferedError", "Offering",
        "ServerSpec", "cost_usd", "gpu_tflops", "load_catalog",
    ])
    assert all(hasattr(cloud, name) for name in cloud.__all__)
