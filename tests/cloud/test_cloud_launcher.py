"""Ray cluster-launcher configs: structure, Ray's own schema validation, install, storage, auth, bad input."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from cmdare import __version__
from cmdare.cloud.catalog import NotOfferedError, load_catalog
from cmdare.cloud.detection import CLOUD_RAY_CONFIG, LOCAL_CLUSTER_RAY_CONFIG, WORKER_PRESTART_ENV
from cmdare.cloud.launcher import (
    DEFAULT_GCP_GPU_IMAGE,
    PS_RESOURCE,
    WORKER_RESOURCE,
    cluster_config,
    gpu_resource,
    local_start_command,
    node_env,
    render_yaml,
    worker_type,
)
from cmdare.cloud.launcher_local import LOCAL_OBJECT_STORE_BYTES
from cmdare.cloud.launcher_setup import parse_env
from cmdare.errors import UnknownNameError, UserInputError

WHEEL_NAME = f"cmdare-{__version__}-py3-none-any.whl"


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A small but valid cmdare wheel (metadata only) with the s3/gcs extras, as pip reads one."""
    path = tmp_path_factory.mktemp("dist") / WHEEL_NAME
    info = f"cmdare-{__version__}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: cmdare\nVersion: {__version__}\n"
                                       "Provides-Extra: s3\nRequires-Dist: s3fs; extra == \"s3\"\n"
                                       "Provides-Extra: gcs\nRequires-Dist: gcsfs; extra == \"gcs\"\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture()
def build(cat, wheel):
    """cluster_config with a wheel (and, for transient clouds, storage) unless told otherwise; warnings collected."""
    warnings_seen: list[str] = []

    def make(cloud, gpu=None, **kwargs):
        if cloud != "local" and "cmdare_spec" not in kwargs:
            kwargs.setdefault("wheel", wheel)
        if cloud != "local" and kwargs.get("transient", True) and not kwargs.get("force"):
            kwargs.setdefault("storage", "s3://ckpt/runs" if cloud == "aws" else "gs://ckpt/runs")
        return cluster_config(cat, cloud, gpu, warn=warnings_seen.append, **kwargs)

    make.warnings = warnings_seen
    return make


@pytest.fixture(scope="module")
def ray_validate():
    from ray.autoscaler._private.util import prepare_config, validate_config

    def check(config: dict) -> dict:
        validate_config(copy.deepcopy(config))  # the file as written
        prepared = prepare_config(copy.deepcopy(config))  # what `ray up` validates after filling defaults
        validate_config(prepared)
        return prepared

    return check


def _all_commands(config: dict) -> list[str]:
    out = []
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands", "head_start_ray_commands",
                "worker_start_ray_commands", "initialization_commands"):
        out += config.get(key, [])
    for node in config["available_node_types"].values():
        out += node.get("worker_setup_commands", [])
    return out


def _assert_no_bare_cmdare(config: dict, pin_asked: bool = False) -> None:
    """No pip command installs the unpublished name ``cmdare`` (alone or with extras; nor pinned, unless asked)."""
    bare = r"cmdare(\[[^\]]*\])?" if pin_asked else r"cmdare(\[[^\]]*\])?(\s*[=<>~!].*)?"
    for command in _all_commands(config):
        if "pip install" not in command:
            continue
        for word in shlex.split(command.replace("&&", " ")):
            assert not re.fullmatch(bare, word), command


@pytest.mark.parametrize("transient", [True, False])
def test_gcp_config_passes_ray_validation_with_preemptible_gpu_workers(cat, build, ray_validate, transient):
    config = build("gcp", "k80", workers=4, ps=1, transient=transient, region="us-east1")
    text = render_yaml(config, cat, transient)
    reparsed = yaml.safe_load(text)
    assert reparsed == config  # the YAML round-trips (no anchors, no Python tags)
    prepared = ray_validate(reparsed)
    types = prepared["available_node_types"]
    assert set(types) == {"cmdare_head", "cmdare_ps", "cmdare_worker_k80"}
    head, ps_node, worker = types["cmdare_head"], types["cmdare_ps"], types["cmdare_worker_k80"]
    assert prepared["head_node_type"] == "cmdare_head"
    assert "scheduling" not in head["node_config"] and "scheduling" not in ps_node["node_config"]  # on-demand
    assert ps_node["min_workers"] == ps_node["max_workers"] == 1 and ps_node["resources"][PS_RESOURCE] == 1
    assert worker["min_workers"] == worker["max_workers"] == 4
    assert worker["resources"] == {"CPU": 4, "GPU": 1, "cmdare_worker": 1, "cmdare_gpu_k80": 1}
    assert worker["labels"] == {"cmdare-role": "worker", "cmdare-gpu": "K80",
                                "cmdare-transient": str(transient).lower()}
    node = worker["node_config"]
    assert node["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-k80", "acceleratorCount": 1}]
    # an object, as the GCE API requires (not the list form of Ray's examples, ray-project/ray#46248)
    assert isinstance(node["scheduling"], dict) and node["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert node["scheduling"].get("preemptible", False) is transient
    assert ("preemptible" in text) is transient
    assert config["provider"]["availability_zone"].startswith("us-east1-")
    assert "CMDARE_NOTICE_PROVIDER=gce" in " ".join(worker["worker_setup_commands"])
    # the head declares a silent (revoked without notice) node dead in seconds, not Ray's default ~15 s+
    head_start = " ".join(prepared["head_start_ray_commands"])
    flag = head_start.split("--system-config=", 1)[1].split()[0].strip("'")
    assert json.loads(flag) == CLOUD_RAY_CONFIG
    assert "--dashboard-host=127.0.0.1" in head_start and "0.0.0.0" not in text
    assert "$0.256/h" in text if transient else "$0.723/h" in text  # the header prices the cluster
    _assert_no_bare_cmdare(config)


@pytest.mark.parametrize(("gpu", "instance", "gpus_per_server", "nodes"),
                         [("k80", "p2.xlarge", 1, 4), ("v100", "p3.2xlarge", 1, 4), ("t4", "g4dn.xlarge", 1, 4),
                          ("l4", "g6.xlarge", 1, 4), ("a100", "p4d.24xlarge", 8, 1), ("h100", "p5.48xlarge", 8, 1)])
def test_aws_config_passes_ray_validation_with_spot_workers(cat, build, ray_validate, gpu, instance, gpus_per_server,
                                                            nodes):
    config = build("aws", gpu, workers=4, ps=2, transient=True)
    text = render_yaml(config, cat)
    prepared = ray_validate(yaml.safe_load(text))
    worker = prepared["available_node_types"][f"cmdare_worker_{gpu}"]
    assert worker["node_config"]["InstanceType"] == instance
    assert worker["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert worker["max_workers"] == worker["min_workers"] == nodes
    assert worker["resources"] == {"CPU": worker["resources"]["CPU"], "GPU": gpus_per_server,
                                   WORKER_RESOURCE: gpus_per_server, gpu_resource(gpu): gpus_per_server}
    for name in ("cmdare_head", "cmdare_ps"):
        node = prepared["available_node_types"][name]["node_config"]
        assert node["InstanceType"] == "m5.xlarge" and "InstanceMarketOptions" not in node
    assert prepared["available_node_types"]["cmdare_ps"]["max_workers"] == 2
    assert prepared["max_workers"] == 2 + nodes
    assert prepared["provider"] == {"type": "aws", "region": "us-east-1", "cache_stopped_nodes": False}
    assert "0.0.0.0" not in text and "Ray picks its default AMI" in text  # no ImageId given
    assert ("sm_37" in text) is (gpu == "k80")


def test_names_the_trainer_places_workers_with():
    assert WORKER_RESOURCE == "cmdare_worker" and PS_RESOURCE == "cmdare_ps"
    assert gpu_resource("K80") == gpu_resource(" k80 ") == "cmdare_gpu_k80"
    assert worker_type("V100") == "cmdare_worker_v100"


def test_every_ray_process_gets_storage_and_token_auth(cat, build):
    config = build("gcp", "t4", workers=2, transient=True, storage="gs://ckpt/runs/")
    text = render_yaml(config, cat)
    expected = {"RAY_AUTH_MODE": "token", "CMDARE_STORAGE": "gs://ckpt/runs"}
    assert node_env(config) == expected
    # head and every worker node export both before `ray start` (actors inherit them); worker nodes also have
    # their raylet prestart worker processes with torch imported ...
    assert parse_env(config["head_start_ray_commands"][1]) == expected
    assert parse_env(config["worker_start_ray_commands"][1]) == {**expected, **WORKER_PRESTART_ENV}
    assert WORKER_PRESTART_ENV["RAY_enable_worker_prestart"] == "1"
    assert all("ray start" in c for c in (config["head_start_ray_commands"][1], config["worker_start_ray_commands"][1]))
    # ... and append them to ~/.bashrc on every node (head: setup_commands; workers: their own list), so the
    # driver run by `ray attach` / `ray exec` sees them too
    node_lists = [config["setup_commands"]] + [t["worker_setup_commands"] for n, t in
                                               config["available_node_types"].items() if n.startswith("cmdare_worker_")]
    for commands in node_lists:
        joined = "\n".join(commands)
        assert "'export CMDARE_STORAGE=gs://ckpt/runs' >> ~/.bashrc" in joined
        assert "'export RAY_AUTH_MODE=token' >> ~/.bashrc" in joined
        assert "source ~/cmdare-venv/bin/activate' >> ~/.bashrc" in joined
    # the token goes to every node; the header says how to make one
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert "ray get-auth-token --generate" in text and "CMDARE_STORAGE=gs://ckpt/runs" in text
    assert "ray dashboard FILE" in text and "0.0.0.0" not in text


def test_wheel_travels_in_file_mounts_and_is_installed_with_the_storage_extra(cat, build, wheel):
    for cloud, storage, extra in (("aws", "s3://b/p", "[s3]"), ("gcp", "gs://b/p", "[gcs]")):
        config = build(cloud, "t4", workers=1, storage=storage)
        remote = f"~/cmdare-wheels/{WHEEL_NAME}"
        assert config["file_mounts"][remote] == str(wheel.resolve())
        install = [c for c in config["setup_commands"] if "cmdare-wheels" in c]
        assert install == [f'pip install "$HOME/cmdare-wheels/{WHEEL_NAME}{extra}" && '
                           f'pip install --force-reinstall --no-deps "$HOME/cmdare-wheels/{WHEEL_NAME}"']
        for name, node in config["available_node_types"].items():
            if name.startswith("cmdare_worker_"):
                assert install[0] in node["worker_setup_commands"]
        assert any(c.startswith('pip install -U "ray[default]==') for c in config["setup_commands"])
        _assert_no_bare_cmdare(config)
        assert str(wheel.resolve()) in render_yaml(config, cat)
    on_demand = build("gcp", "t4", workers=1, transient=False)
    assert f'"$HOME/cmdare-wheels/{WHEEL_NAME}" &&' in " ".join(on_demand["setup_commands"])  # no extra


def test_pip_takes_the_generated_install_command(build, wheel, tmp_path):
    """The command as the node's shell runs it: $HOME expands, pip parses the wheel path with its extra."""
    home = tmp_path / "home"
    (home / "cmdare-wheels").mkdir(parents=True)
    (home / "cmdare-wheels" / WHEEL_NAME).write_bytes(wheel.read_bytes())
    config = build("aws", "t4", workers=1, storage="s3://b/p")
    first = next(c for c in config["setup_commands"] if "cmdare-wheels" in c).split(" && ")[0]
    report = tmp_path / "report.json"
    pip = (f"{shlex.quote(sys.executable)} -m pip install --dry-run --no-deps --no-index --ignore-installed "
           f"--quiet --report {shlex.quote(str(report))} ")
    env = {**os.environ, "HOME": str(home), "PIP_CONFIG_FILE": os.devnull}
    run = subprocess.run(["bash", "-c", first.replace("pip install ", pip, 1)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    [item] = json.loads(report.read_text())["install"]
    assert item["metadata"]["name"] == "cmdare" and item["requested_extras"] == ["s3"]
    assert item["download_info"]["url"].endswith(f"/home/cmdare-wheels/{WHEEL_NAME}")


def test_cmdare_spec_instead_of_a_wheel(build):
    cases = {("git+https://github.com/me/cmdare@v1", "s3://b/p"): "'cmdare[s3] @ git+https://github.com/me/cmdare@v1'",
             ("cmdare==0.2.0", "gs://b/p"): "'cmdare[gcs]==0.2.0'",
             ("cmdare[s3]>=0.1", "s3://b/p"): "'cmdare[s3]>=0.1'",
             ("https://example.org/cmdare-0.2-py3-none-any.whl", None): "https://example.org/cmdare-0.2-py3-none-any.whl"}
    for (spec, storage), pip_arg in cases.items():
        cloud = "gcp" if storage and storage.startswith("gs") else "aws"
        config = build(cloud, "t4", workers=1, cmdare_spec=spec, storage=storage, transient=storage is not None)
        assert f"pip install -U {pip_arg}" in config["setup_commands"]
        assert list(config["file_mounts"]) == ["~/.ray/auth_token"]  # no wheel travels
        _assert_no_bare_cmdare(config, pin_asked=True)
    for spec, needle in (("cmdare", "not published"), (" cmdare[s3] ", "not published"), ("", "empty"),
                         ("./dist/cmdare-0.1.0-py3-none-any.whl", "--wheel")):
        with pytest.raises(UserInputError, match=re.escape(needle)):
            build("aws", "t4", workers=1, cmdare_spec=spec)
    with pytest.raises(UserInputError, match="not both"):
        build("aws", "t4", workers=1, cmdare_spec="cmdare==1.0", wheel="x.whl")


def test_newest_wheel_of_this_version_in_dist_is_the_default(cat, tmp_path, monkeypatch):
    seen: list[str] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CMDARE_HOME", str(tmp_path / "home"))
    packed = cluster_config(cat, "gcp", "t4", workers=1, transient=False, warn=seen.append)  # none in dist/
    wheel_path = tmp_path / "home" / "wheels" / f"cmdare-{__version__}-py3-none-any.whl"
    assert packed["file_mounts"][f"~/cmdare-wheels/{wheel_path.name}"] == str(wheel_path.resolve())
    assert wheel_path.is_file() and any("packed into" in w for w in seen)
    dist = tmp_path / "dist"
    dist.mkdir()
    old, new = dist / f"cmdare-{__version__}-py3-none-any.whl", dist / f"cmdare-{__version__}-1-py3-none-any.whl"
    other = dist / "cmdare-999.0-py3-none-any.whl"
    for i, path in enumerate((old, new, other)):
        path.write_bytes(b"wheel")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    config = cluster_config(cat, "gcp", "t4", workers=1, transient=False, warn=seen.append)
    assert config["file_mounts"][f"~/cmdare-wheels/{new.name}"] == str(new.resolve())
    assert any(str(new) in w and "dist/cmdare-" in w for w in seen)  # said so (the CLI prints it on stderr)
    with pytest.raises(UserInputError, match="no such file"):
        cluster_config(cat, "gcp", "t4", workers=1, transient=False, wheel=tmp_path / "missing.whl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserInputError, match="not a cmdare wheel"):
        cluster_config(cat, "gcp", "t4", workers=1, transient=False, wheel=tmp_path / "notes.txt")


def test_storage_rules(build):
    # transient without storage: a placeholder no bucket can have, so `cmdare train` stops until it is filled in
    for cloud, placeholder in (("gcp", "gs://FILL-IN-YOUR-BUCKET/cmdare"), ("aws", "s3://FILL-IN-YOUR-BUCKET/cmdare")):
        assert node_env(build(cloud, "t4", workers=1, storage=None))["CMDARE_STORAGE"] == placeholder
    assert any("transient workers need durable storage" in w for w in build.warnings)
    forced = build("gcp", "t4", workers=1, force=True)
    assert "CMDARE_STORAGE" not in node_env(forced) and node_env(forced) == {"RAY_AUTH_MODE": "token"}
    assert any("no --storage" in w for w in build.warnings)
    assert "CMDARE_STORAGE" not in node_env(build("aws", "t4", workers=1, transient=False))  # on-demand: allowed
    for bad, needle in (("/mnt/ckpt", "local path"), ("file:///mnt/ckpt", "local path"), ("ckpt", "local path"),
                        ("hdfs://nn/ckpt", "s3:// or gs://"), ("s3://b/with space", "spaces")):
        with pytest.raises(UserInputError, match=needle):
            build("gcp", "t4", workers=1, storage=bad)
    build.warnings.clear()
    assert node_env(build("gcp", "t4", workers=1, storage="s3://b/p"))["CMDARE_STORAGE"] == "s3://b/p"
    assert any("aws storage for a gcp cluster" in w for w in build.warnings)
    build.warnings.clear()
    build("aws", "t4", workers=1, storage="gs://b/p")
    assert any("gcp storage for a aws cluster" in w for w in build.warnings)


def test_one_worker_node_type_per_gpu_type(cat, build, ray_validate):
    config = build("gcp", workers="k80:2,v100:1", ps=1, transient=True, region="us-central1")
    prepared = ray_validate(config)
    types = prepared["available_node_types"]
    assert set(types) == {"cmdare_head", "cmdare_ps", "cmdare_worker_k80", "cmdare_worker_v100"}
    for gpu, name, count in (("k80", "K80", 2), ("v100", "V100", 1)):
        node = types[f"cmdare_worker_{gpu}"]
        assert node["min_workers"] == node["max_workers"] == count
        assert node["resources"] == {"CPU": 4, "GPU": 1, "cmdare_worker": 1, f"cmdare_gpu_{gpu}": 1}
        assert node["labels"] == {"cmdare-role": "worker", "cmdare-gpu": name, "cmdare-transient": "true"}
        assert node["node_config"]["guestAccelerators"][0]["acceleratorType"] == f"nvidia-tesla-{gpu}"
    assert config["max_workers"] == 1 + 2 + 1
    assert config["provider"]["availability_zone"] == "us-central1-a"  # a zone with both GPU types
    text = render_yaml(config, cat)
    assert "2 x K80 $0.256/h + 1 x V100 $1.04/h + 2 x CPU $0.19/h = $1.932/h" in " ".join(
        line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    aws = build("aws", workers={"a100": 4, "T4": 3}, transient=True)
    assert aws["available_node_types"]["cmdare_worker_a100"]["resources"]["GPU"] == 8
    assert aws["available_node_types"]["cmdare_worker_a100"]["max_workers"] == 1
    assert aws["available_node_types"]["cmdare_worker_t4"]["max_workers"] == 3
    assert aws["max_workers"] == 1 + 1 + 3
    assert build("gcp", "t4", workers="t4:2")["available_node_types"]["cmdare_worker_t4"]["max_workers"] == 2
    for workers in (4, "4"):  # a bare count without a GPU type: the default GPU's, as in every command (issue 42)
        assert build("aws", workers=workers)["available_node_types"]["cmdare_worker_t4"]["max_workers"] == 4


def test_an_all_reduce_cluster_has_no_ps_nodes(cat, build, ray_validate):
    """``--ps 0`` (what ``cmdare plan`` prints for an all-reduce choice): the head and the GPU workers only, priced
    so, and the printed train command trains with all-reduce."""
    config = build("gcp", workers="t4:2", ps=0, transient=True, region="us-east1")
    ray_validate(config)
    assert set(config["available_node_types"]) == {"cmdare_head", "cmdare_worker_t4"}
    assert config["max_workers"] == 2
    text = render_yaml(config, cat)
    assert "1 x CPU" in text and "0 on-demand PS node(s)" in text
    assert "--workers t4:2 --topology allreduce" in text


def test_boot_images_per_gpu_and_the_k80_caveat(cat, build):
    k80 = build("gcp", "k80", workers=1, region="us-east1")
    image = k80["available_node_types"]["cmdare_worker_k80"]["node_config"]["disks"][0]["initializeParams"]
    assert re.search(r"/family/common-cu11\d-", image["sourceImage"])  # a CUDA 11 family: K80's R470 driver
    text = render_yaml(k80, cat)
    assert "sm_37" in text and "older torch" in text and "another GPU" in text
    assert any("sm_37" in w for w in build.warnings)
    t4 = build("gcp", "t4", workers=1)
    t4_image = t4["available_node_types"]["cmdare_worker_t4"]["node_config"]["disks"][0]["initializeParams"]
    assert t4_image["sourceImage"] == DEFAULT_GCP_GPU_IMAGE and "cu12" in DEFAULT_GCP_GPU_IMAGE
    assert "sm_37" not in render_yaml(t4, cat)
    mine = build("gcp", "k80", workers=1, region="us-east1", image="projects/me/global/images/mine")
    assert mine["available_node_types"]["cmdare_worker_k80"]["node_config"]["disks"][0]["initializeParams"][
        "sourceImage"] == "projects/me/global/images/mine"
    build.warnings.clear()
    aws = build("aws", "k80", workers=1)
    assert "sm_37" in render_yaml(aws, cat) and any("sm_37" in w for w in build.warnings)
    ami = build("aws", "t4", workers=1, image="ami-0123456789abcdef0")
    assert ami["available_node_types"]["cmdare_worker_t4"]["node_config"]["ImageId"] == "ami-0123456789abcdef0"
    assert "ImageId" not in ami["available_node_types"]["cmdare_ps"]["node_config"]
    assert "Ray picks its default AMI" not in render_yaml(ami, cat)


def test_local_config_for_rays_fake_multinode_provider(cat, tmp_path, monkeypatch):
    from ray.autoscaler._private.util import validate_config

    monkeypatch.chdir(tmp_path)
    config = cluster_config(cat, "local", workers="k80:2,v100:1", ps=1, transient=True, storage="ckpt",
                            cpus_per_node=2, spare_nodes=1, config_path=str(tmp_path / "local.yaml"))
    validate_config(copy.deepcopy(config))  # Ray's schema accepts the fake provider's config as written
    assert config["provider"] == {"type": "external", "module": "cmdare.cloud.local_node_provider.LocalNodeProvider",
                                  "use_node_id_as_ip": True, "disable_node_updaters": True,
                                  "disable_launch_config_check": True, "launch_multiple": True,
                                  "gcs_address": "127.0.0.1:6379"}
    types = config["available_node_types"]
    assert config["head_node_type"] == "ray.head.default"
    assert set(types) == {"ray.head.default", "cmdare_ps", "cmdare_worker_k80", "cmdare_worker_v100"}
    assert types["ray.head.default"]["max_workers"] == 0
    assert types["cmdare_worker_k80"]["resources"] == {"CPU": 2, "object_store_memory": LOCAL_OBJECT_STORE_BYTES,
                                                       "cmdare_worker": 1, "cmdare_gpu_k80": 1}
    assert LOCAL_OBJECT_STORE_BYTES == 157286400
    assert all("GPU" not in t["resources"] for t in types.values())  # local nodes have none
    assert types["cmdare_worker_k80"]["labels"] == {"cmdare-role": "worker", "cmdare-gpu": "K80",
                                                    "cmdare-transient": "true"}
    assert (types["cmdare_worker_k80"]["min_workers"], types["cmdare_worker_k80"]["max_workers"]) == (2, 3)
    assert (types["cmdare_worker_v100"]["min_workers"], types["cmdare_worker_v100"]["max_workers"]) == (1, 2)
    assert (types["cmdare_ps"]["min_workers"], types["cmdare_ps"]["max_workers"]) == (1, 2)
    assert types["cmdare_ps"]["resources"][PS_RESOURCE] == 1
    assert config["max_workers"] == 3 + 2 + 2
    start = local_start_command(config)
    env = parse_env(start)
    assert env == {"RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "token", "CMDARE_STORAGE": str(Path.cwd() / "ckpt")}
    for flag in ("ray start --head", "--node-ip-address=127.0.0.1", "--port=6379", "--dashboard-host=127.0.0.1",
                 f"--autoscaling-config={tmp_path / 'local.yaml'}", "--num-cpus=2"):
        assert flag in start
    assert json.loads(start.split("--system-config=", 1)[1].strip("'")) == LOCAL_CLUSTER_RAY_CONFIG
    text = render_yaml(config, cat)
    assert yaml.safe_load(text) == config and "0.0.0.0" not in text
    assert start in text and "cmdare train --address auto --workers k80:2,v100:1 --ps 1" in text  # not 3 K80s
    # defaults: 1 CPU, 1 spare node; transient without storage is fine on one machine (one disk)
    plain = cluster_config(cat, "local", "t4", workers=2, head_port=26379)
    assert plain["available_node_types"]["cmdare_worker_t4"]["resources"]["CPU"] == 1
    assert plain["available_node_types"]["cmdare_worker_t4"]["max_workers"] == 3
    assert plain["provider"]["gcs_address"] == "127.0.0.1:26379" and "--port=26379" in local_start_command(plain)
    assert "CMDARE_STORAGE" not in parse_env(local_start_command(plain))


def test_options_of_the_other_kind_of_cluster_are_refused(cat, build):
    with pytest.raises(UserInputError, match="--cpus-per-node, --spare-nodes: only for --cloud local"):
        build("gcp", "t4", workers=1, cpus_per_node=2, spare_nodes=0)
    for kwargs in ({"zone": "x"}, {"wheel": "x.whl"}, {"cmdare_spec": "cmdare==1"}, {"image": "i"}):
        with pytest.raises(UserInputError, match="only for a cloud"):
            cluster_config(cat, "local", "t4", workers=1, **kwargs)
    for kwargs, needle in (({"cpus_per_node": 0}, "--cpus-per-node must be >= 1"),
                           ({"spare_nodes": -1}, "--spare-nodes must be >= 0"),
                           ({"head_port": 70000}, "--head-port must be <= 65535")):
        with pytest.raises(UserInputError, match=needle):
            cluster_config(cat, "local", "t4", workers=1, **kwargs)


def test_bad_input_gives_clear_errors(cat, build):
    with pytest.raises(NotOfferedError, match="P100 servers are not offered in 'aws'; offered in: gcp"):
        cluster_config(cat, "aws", "p100", workers=4)  # the catalog speaks first, before storage and wheel
    with pytest.raises(UnknownNameError, match="GPU type 'x100'"):
        build("gcp", "x100", workers=4)
    with pytest.raises(UnknownNameError, match="GPU type 'x100'"):
        build("gcp", workers="k80:1,x100:2")
    with pytest.raises(UnknownNameError, match="region 'us-nowhere1'"):
        build("gcp", "t4", workers=4, region="us-nowhere1")
    with pytest.raises(UnknownNameError, match="cloud 'azure'"):
        build("azure", "t4", workers=4)
    for kwargs in ({"workers": 0}, {"workers": -2}, {"workers": "-2"}, {"workers": 2, "ps": -1}, {"workers": 2.5}):
        with pytest.raises(UserInputError, match="--(workers|ps) must be"):
            build("gcp", "t4", **kwargs)
    for workers, needle in (("k80:x", "--workers: bad GPU count 'k80:x'"), ("k80:-1", "negative"),
                            ("k80:0", "at least 1 worker of k80"), (",", "no GPUs"), ("1.5", "whole number")):
        with pytest.raises(UserInputError, match=needle):
            build("gcp", workers=workers)
    with pytest.raises(UserInputError, match="does not match"):
        build("gcp", "t4", workers="k80:2")
    with pytest.raises(UserInputError, match="not in region"):
        build("gcp", "t4", workers=1, zone="europe-west4-a")
    with pytest.raises(UnknownNameError, match="zone"):
        build("gcp", "v100", workers=1, region="us-east1", zone="us-east1-b")
    with pytest.raises(UserInputError, match="no us-east1 zone offers all of K80, A100"):
        build("gcp", workers="k80:1,a100:1", region="us-east1")
    with pytest.raises(UserInputError, match="Spot/Flex-start only"):
        build("gcp", "h100", workers=1, transient=False)
