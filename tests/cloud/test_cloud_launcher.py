"""Ray cluster-launcher configs: structure, Ray's own schema validation, bad input."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from cmdare.cloud.catalog import NotOfferedError, load_catalog
from cmdare.cloud.detection import CLOUD_FAILURE_DETECTION
from cmdare.cloud.launcher import PS_RESOURCE, WORKER_RESOURCE, cluster_config, render_yaml
from cmdare.errors import UnknownNameError, UserInputError


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


@pytest.fixture(scope="module")
def ray_validate():
    from ray.autoscaler._private.util import prepare_config, validate_config

    def check(config: dict) -> dict:
        validate_config(copy.deepcopy(config))  # the file as written
        prepared = prepare_config(copy.deepcopy(config))  # what `ray up` validates after filling defaults
        validate_config(prepared)
        return prepared

    return check


@pytest.mark.parametrize("transient", [True, False])
def test_gcp_config_passes_ray_validation_with_preemptible_gpu_workers(cat, ray_validate, transient):
    config = cluster_config(cat, "gcp", "k80", workers=4, ps=1, transient=transient, region="us-east1")
    text = render_yaml(config, cat, transient)
    reparsed = yaml.safe_load(text)
    assert reparsed == config  # the YAML round-trips (no anchors, no Python tags)
    prepared = ray_validate(reparsed)
    types = prepared["available_node_types"]
    head, ps_node, worker = types["cmdare_head"], types["cmdare_ps"], types["cmdare_worker"]
    assert prepared["head_node_type"] == "cmdare_head"
    assert "scheduling" not in head["node_config"] and "scheduling" not in ps_node["node_config"]  # on-demand
    assert ps_node["min_workers"] == ps_node["max_workers"] == 1 and ps_node["resources"][PS_RESOURCE] == 1
    assert worker["min_workers"] == worker["max_workers"] == 4
    assert worker["resources"] == {"CPU": 4, "GPU": 1, WORKER_RESOURCE: 1}
    node = worker["node_config"]
    assert node["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-k80", "acceleratorCount": 1}]
    # an object, as the GCE API requires (not the list form of Ray's examples, ray-project/ray#46248)
    assert isinstance(node["scheduling"], dict) and node["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert node["scheduling"].get("preemptible", False) is transient
    assert ("preemptible" in text) is transient
    assert config["provider"]["availability_zone"].startswith("us-east1-")
    assert any("cmdare" in cmd for cmd in prepared["setup_commands"])
    assert "CMDARE_NOTICE_PROVIDER=gce" in " ".join(worker["worker_setup_commands"])
    # the head declares a silent (revoked without notice) node dead in seconds, not Ray's default ~15 s+
    head_start = " ".join(prepared["head_start_ray_commands"])
    flag = head_start.split("--system-config=", 1)[1].split()[0].strip("'")
    assert json.loads(flag) == CLOUD_FAILURE_DETECTION
    assert "$0.256/h" in text if transient else "$0.723/h" in text  # the header prices the cluster


@pytest.mark.parametrize(("gpu", "instance", "gpus_per_server", "nodes"),
                         [("k80", "p2.xlarge", 1, 4), ("v100", "p3.2xlarge", 1, 4), ("t4", "g4dn.xlarge", 1, 4),
                          ("l4", "g6.xlarge", 1, 4), ("a100", "p4d.24xlarge", 8, 1), ("h100", "p5.48xlarge", 8, 1)])
def test_aws_config_passes_ray_validation_with_spot_workers(cat, ray_validate, gpu, instance, gpus_per_server, nodes):
    config = cluster_config(cat, "aws", gpu, workers=4, ps=2, transient=True)
    prepared = ray_validate(yaml.safe_load(render_yaml(config, cat)))
    worker = prepared["available_node_types"]["cmdare_worker"]
    assert worker["node_config"]["InstanceType"] == instance
    assert worker["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert worker["max_workers"] == nodes and worker["resources"][WORKER_RESOURCE] == gpus_per_server
    for name in ("cmdare_head", "cmdare_ps"):
        node = prepared["available_node_types"][name]["node_config"]
        assert node["InstanceType"] == "m5.xlarge" and "InstanceMarketOptions" not in node
    assert prepared["available_node_types"]["cmdare_ps"]["max_workers"] == 2
    assert prepared["max_workers"] == 2 + nodes
    assert prepared["provider"] == {"type": "aws", "region": "us-east-1", "cache_stopped_nodes": False}


def test_other_gcp_gpu_families_validate(cat, ray_validate):
    l4 = cluster_config(cat, "gcp", "L4", workers=2, transient=True, region="europe-west4", project_id="p-1")
    node = ray_validate(l4)["available_node_types"]["cmdare_worker"]["node_config"]
    assert node["machineType"] == "g2-standard-4" and "guestAccelerators" not in node  # G2 includes its GPU
    assert l4["provider"]["project_id"] == "p-1"
    h100 = cluster_config(cat, "gcp", "h100", workers=1, transient=True)
    assert ray_validate(h100)["available_node_types"]["cmdare_worker"]["node_config"]["machineType"] == "a3-highgpu-1g"


def test_bad_input_gives_clear_errors(cat):
    with pytest.raises(NotOfferedError, match="P100 servers are not offered in 'aws'; offered in: gcp"):
        cluster_config(cat, "aws", "p100", workers=4)
    with pytest.raises(UnknownNameError, match="GPU type 'x100'"):
        cluster_config(cat, "gcp", "x100", workers=4)
    with pytest.raises(UnknownNameError, match="region 'us-nowhere1'"):
        cluster_config(cat, "gcp", "t4", workers=4, region="us-nowhere1")
    with pytest.raises(UnknownNameError, match="cloud 'azure'"):
        cluster_config(cat, "azure", "t4", workers=4)
    for kwargs in ({"workers": 0}, {"workers": -2}, {"workers": 2, "ps": 0}, {"workers": 2.5}):
        with pytest.raises(UserInputError, match="--(workers|ps) must be"):
            cluster_config(cat, "gcp", "t4", **kwargs)
    with pytest.raises(UserInputError, match="not in region"):
        cluster_config(cat, "gcp", "t4", workers=1, zone="europe-west4-a")
    with pytest.raises(UnknownNameError, match="zone"):
        cluster_config(cat, "gcp", "v100", workers=1, region="us-east1", zone="us-east1-b")
    with pytest.raises(UserInputError, match="Spot/Flex-start only"):
        cluster_config(cat, "gcp", "h100", workers=1, transient=False)
