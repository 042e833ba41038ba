"""Ray cluster-launcher configs for real clouds: on-demand head and PS nodes, transient GPU workers.

:func:`cluster_config` builds the config as a dictionary from the catalog (instance types, GPUs per
server, zones); :func:`render_yaml` writes it with a header that says what it will cost per hour and
what to fill in. The layout is the one cmdare's engine expects:

* ``cmdare_head``: on-demand CPU server running the Ray head and the training driver;
* ``cmdare_ps``: ``ps`` on-demand CPU servers, each with custom resource ``{"cmdare_ps": 1}`` so
  parameter shards are placed there;
* ``cmdare_worker``: GPU servers (GCP preemptible / AWS Spot when ``transient``) with
  ``{"cmdare_worker": <gpus per server>}``, one training worker per GPU. Their setup exports
  ``CMDARE_NOTICE_PROVIDER`` (``gce``/``aws``) so each worker can watch its preemption notice.

GCP preemptible nodes get ``scheduling: {preemptible: true, automaticRestart: false,
onHostMaintenance: TERMINATE}`` - an object, as in the GCE REST API, not the list form of Ray's example
files, which GCE rejects (ray-project/ray#46248); preemptible (not Spot) VMs live at most 24 h and get the
30 s notice that CM-DARE's lifetime data describe. AWS Spot nodes use
``InstanceMarketOptions: {MarketType: spot}``. The result passes
``ray.autoscaler._private.util.validate_config``.
"""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import yaml

from cmdare.cloud.catalog import Catalog, Offering
from cmdare.cloud.detection import CLOUD_FAILURE_DETECTION, system_config_flag
from cmdare.errors import UnknownNameError, UserInputError

__all__ = [
    "DEFAULT_GCP_CPU_IMAGE",
    "DEFAULT_GCP_GPU_IMAGE",
    "DEFAULT_REGIONS",
    "HEAD_TYPE",
    "PS_RESOURCE",
    "PS_TYPE",
    "WORKER_RESOURCE",
    "WORKER_TYPE",
    "cluster_config",
    "render_yaml",
]

HEAD_TYPE = "cmdare_head"
PS_TYPE = "cmdare_ps"
WORKER_TYPE = "cmdare_worker"
PS_RESOURCE = "cmdare_ps"
WORKER_RESOURCE = "cmdare_worker"
DEFAULT_REGIONS = {"gcp": "us-central1", "aws": "us-east-1"}
# Ray's own GCP defaults use this CPU image family (ray/autoscaler/gcp/defaults.yaml).
DEFAULT_GCP_CPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cpu"
# A CUDA image family of Google's Deep Learning VM images; families are renamed over time, check with
# `gcloud compute images list --project deeplearning-platform-release` and pass --image to override.
DEFAULT_GCP_GPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu121-debian-11-py310"
_DISK_GB = 100


def _count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserInputError(f"--{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise UserInputError(f"--{name} must be >= {minimum}, got {value}")
    return value


def _ray_version() -> str | None:
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None


def _setup_commands(cmdare_spec: str) -> list[str]:
    ray_version = _ray_version()
    ray_pin = f"ray[default]=={ray_version}" if ray_version else "ray[default]"
    return [f'pip install -U "{ray_pin}"', f'pip install -U "{cmdare_spec}"']


def _gcp_disk(image: str) -> list[dict[str, Any]]:
    return [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
             "initializeParams": {"diskSizeGb": _DISK_GB, "sourceImage": image}}]


def _gcp_node_config(off: Offering, image: str, transient: bool) -> dict[str, Any]:
    node: dict[str, Any] = {"machineType": off.machine_type, "disks": _gcp_disk(image)}
    if off.gpu is not None:
        if off.accelerator:  # N1 machines take attached GPUs; A2/A3/G2 machine types include theirs
            node["guestAccelerators"] = [{"acceleratorType": off.accelerator,
                                          "acceleratorCount": off.gpus_per_server}]
        node["metadata"] = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}
    # GCE's Instance.scheduling is an object (REST reference); Ray's example YAMLs write a list of
    # one-key objects, which the API does not accept (ray-project/ray#46248), so cmdare emits the object.
    scheduling: dict[str, Any] = {}
    if transient:
        scheduling.update(preemptible=True, automaticRestart=False)
    if off.gpu is not None or transient:
        scheduling["onHostMaintenance"] = "TERMINATE"  # GPU and preemptible VMs cannot live-migrate
    if scheduling:
        node["scheduling"] = scheduling
    return node


def _aws_node_config(off: Offering, transient: bool) -> dict[str, Any]:
    node: dict[str, Any] = {
        "InstanceType": off.machine_type,
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": _DISK_GB}}],
    }
    if transient:
        node["InstanceMarketOptions"] = {"MarketType": "spot"}
    return node


def cluster_config(
    catalog: Catalog,
    cloud: str,
    gpu: str,
    workers: int,
    ps: int = 1,
    transient: bool = True,
    region: str | None = None,
    zone: str | None = None,
    cluster_name: str | None = None,
    project_id: str | None = None,
    cmdare_spec: str = "cmdare",
    image: str | None = None,
) -> dict[str, Any]:
    """A Ray cluster-launcher config for ``workers`` GPU workers and ``ps`` parameter servers.

    Args:
        catalog: where instance types, GPUs per server and zones come from.
        cloud: ``'gcp'`` or ``'aws'``.
        gpu: GPU type (case-insensitive), e.g. ``'k80'``.
        workers: number of training workers (one per GPU); servers = ceil(workers / GPUs per server).
        ps: number of parameter-server nodes (on-demand, CPU only).
        transient: preemptible (GCP) / Spot (AWS) GPU workers.
        region: cloud region (default ``us-central1`` / ``us-east-1``).
        zone: GCP zone (default: the catalog's first zone for that GPU); AWS availability zone (default:
            let Ray choose).
        cluster_name: Ray cluster name (default ``cmdare-<gpu>-<cloud>``).
        project_id: GCP project (left ``null`` for the user to fill in when not given).
        cmdare_spec: what ``pip install`` installs on every node (a version, wheel or git URL).
        image: GCP boot image for GPU nodes (default :data:`DEFAULT_GCP_GPU_IMAGE`).

    Raises:
        UnknownNameError: unknown cloud, GPU type or region, or the GPU is not offered there.
        UserInputError: non-positive counts, a zone outside the region, or on-demand for a Spot-only
            machine type.
    """
    workers = _count("workers", workers)
    ps = _count("ps", ps)
    cloud_key = str(cloud).strip().lower()
    if cloud_key not in DEFAULT_REGIONS:
        raise UnknownNameError("cloud", cloud, list(DEFAULT_REGIONS))
    gpu_type = catalog.gpu(gpu).name
    region = region or _default_region(catalog, cloud_key, gpu_type)
    worker_off = catalog.offering(gpu_type, cloud_key, region, role="worker")
    ps_off = catalog.offering(None, cloud_key, region, role="ps")
    if worker_off.spot_only and not transient:
        raise UserInputError(f"{worker_off.machine_type} ({gpu_type}) is Spot/Flex-start only on {cloud_key}; "
                             "use --transient or another GPU")
    nodes = math.ceil(workers / worker_off.gpus_per_server)
    name = cluster_name or f"cmdare-{gpu_type.lower()}-{cloud_key}"
    setup = _setup_commands(cmdare_spec)
    notice_provider = "gce" if cloud_key == "gcp" else "aws"
    worker_env = [
        f"echo 'export CMDARE_NOTICE_PROVIDER={notice_provider}' >> ~/.bashrc",
        f"echo 'export CMDARE_TRANSIENT={int(transient)}' >> ~/.bashrc",
    ]

    if cloud_key == "gcp":
        zones = list(worker_off.zones)
        if zone is None:
            zone = zones[0] if zones else f"{region}-a"
        elif not zone.startswith(region + "-"):
            raise UserInputError(f"zone {zone!r} is not in region {region!r}")
        elif zones and zone not in zones:
            raise UnknownNameError(f"{region} zone with {gpu_type} GPUs", zone, zones)
        provider: dict[str, Any] = {"type": "gcp", "region": region, "availability_zone": zone,
                                    "project_id": project_id}
        cpu_node = _gcp_node_config(ps_off, DEFAULT_GCP_CPU_IMAGE, transient=False)
        worker_node = _gcp_node_config(worker_off, image or DEFAULT_GCP_GPU_IMAGE, transient)
        head_setup = ["pip install -U google-api-python-client"]
    else:
        provider = {"type": "aws", "region": region, "cache_stopped_nodes": False}
        if zone is not None:
            if not zone.startswith(region):
                raise UserInputError(f"availability zone {zone!r} is not in region {region!r}")
            provider["availability_zone"] = zone
        cpu_node = _aws_node_config(ps_off, transient=False)
        worker_node = _aws_node_config(worker_off, transient)
        head_setup = ["pip install -U 'boto3>=1.4.8'"]  # 1.4.8 adds InstanceMarketOptions

    labels = {"cmdare-gpu": gpu_type, "cmdare-transient": str(transient).lower()}
    return {
        "cluster_name": name,
        "max_workers": ps + nodes,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "provider": provider,
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            HEAD_TYPE: {"resources": {"CPU": ps_off.vcpus}, "node_config": cpu_node},
            PS_TYPE: {
                "min_workers": ps, "max_workers": ps,
                "resources": {"CPU": ps_off.vcpus, PS_RESOURCE: 1},
                "labels": {"cmdare-role": "ps"},
                "node_config": copy.deepcopy(cpu_node),
            },
            WORKER_TYPE: {
                "min_workers": nodes, "max_workers": nodes,
                "resources": {"CPU": worker_off.vcpus, "GPU": worker_off.gpus_per_server,
                              WORKER_RESOURCE: worker_off.gpus_per_server},
                "labels": {"cmdare-role": "worker", **labels},
                "worker_setup_commands": setup + worker_env,
                "node_config": worker_node,
            },
        },
        "head_node_type": HEAD_TYPE,
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": setup,
        "head_setup_commands": head_setup,
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            "ulimit -n 65536; ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0 "
            + system_config_flag(CLOUD_FAILURE_DETECTION),
        ],
        "worker_start_ray_commands": [
            "ray stop",
            "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076",
        ],
    }


def _default_region(catalog: Catalog, cloud: str, gpu_type: str) -> str:
    preferred = DEFAULT_REGIONS[cloud]
    regions = sorted({o.region for o in catalog.find(gpu=gpu_type, cloud=cloud, role="worker")})
    if not regions or preferred in regions:
        return preferred  # catalog.offering() reports "not offered" with the clouds that do offer it
    return regions[0]


def render_yaml(config: dict[str, Any], catalog: Catalog | None = None, transient: bool | None = None) -> str:
    """The config as YAML with a header: what to fill in and, given the catalog, the hourly cost."""
    types = config["available_node_types"]
    provider = config["provider"]
    cloud, region = provider["type"], provider["region"]
    worker = types[WORKER_TYPE]
    gpu = worker.get("labels", {}).get("cmdare-gpu")
    if transient is None:
        transient = worker.get("labels", {}).get("cmdare-transient") == "true"
    lines = [
        f"# Ray cluster-launcher config generated by cmdare on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"# {worker['max_workers']} x {gpu} GPU worker node(s) ({'preemptible/spot' if transient else 'on-demand'}),"
        f" {types[PS_TYPE]['max_workers']} on-demand PS node(s), 1 on-demand head; {cloud} {region}.",
        "# Launch: ray up <this file>; train: ray attach <this file>, then cmdare train --address auto ...",
    ]
    if catalog is not None and gpu is not None:
        try:
            worker_off = catalog.offering(gpu, cloud, region, role="worker")
            ps_off = catalog.offering(None, cloud, region, role="ps")
            w_price = worker_off.server_price_per_hour_usd(transient)
            c_price = ps_off.server_price_per_hour_usd(False)
            if w_price is not None and c_price is not None:
                n_w, n_ps = worker["max_workers"], types[PS_TYPE]["max_workers"]
                total = n_w * w_price + (n_ps + 1) * c_price
                lines.append(f"# Catalog price: {n_w} x ${w_price:.4g}/h + {n_ps + 1} x ${c_price:.4g}/h = "
                             f"${total:.4g}/h (sources: {worker_off.source}; {ps_off.source}).")
        except UnknownNameError:
            pass
    if cloud == "gcp" and provider.get("project_id") is None:
        lines.append("# Fill in provider.project_id (or pass --project-id) before `ray up`.")
    if cloud == "gcp":
        lines.append("# GPU boot image: check the family exists (gcloud compute images list "
                     "--project deeplearning-platform-release) or pass --image.")
    else:
        lines.append("# No ImageId given: Ray picks its default deep-learning AMI for the region.")
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=110)
    return "\n".join(lines) + "\n" + body
