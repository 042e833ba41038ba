"""Ray cluster-launcher configs: on-demand head and PS nodes, (transient) GPU workers, one node type per GPU type.

:func:`cluster_config` builds the config as a dictionary from the catalog (instance types, GPUs per
server, zones); :func:`render_yaml` writes it with a header that says what it costs per hour, how to
start it and what to fill in. The node types are those cmdare's trainer expects:

* ``cmdare_head``: on-demand CPU server running the Ray head, its dashboard on 127.0.0.1 only, and the
  training driver;
* ``cmdare_ps``: ``ps`` on-demand CPU servers with ``{"cmdare_ps": 1}``, where parameter shards go;
* ``cmdare_worker_<gpu>`` per GPU type (``--workers k80:2,v100:1``): GPU servers (GCP preemptible / AWS
  Spot when ``transient``) with ``{"GPU": n, "cmdare_worker": n, "cmdare_gpu_<gpu>": n}`` for ``n`` GPUs
  per server, one training worker per GPU, and labels ``cmdare-role``, ``cmdare-gpu``,
  ``cmdare-transient``. Their setup exports ``CMDARE_NOTICE_PROVIDER`` (``gce``/``aws``) so each worker
  watches its preemption notice.

Every node installs this project (a local wheel copied through ``file_mounts``, or a pip spec the user
names) into a Python 3.11+ environment, gets ``CMDARE_STORAGE`` (an ``s3://``/``gs://`` location, required
for transient workers) and runs Ray with token authentication (``RAY_AUTH_MODE=token``, the user's
``~/.ray/auth_token`` copied to every node): see :mod:`cmdare.cloud.launcher_setup`. Boot images are chosen
per GPU type (:mod:`cmdare.cloud.launcher_nodes`); ``cloud='local'`` builds the same node types for Ray's
fake multi-node provider on this machine (:mod:`cmdare.cloud.launcher_local`); the YAML and its header are
:mod:`cmdare.cloud.launcher_render`; the names of node types, resources and labels are
:mod:`cmdare.cloud.launcher_names`. ``docs/cluster.md`` says how to launch a cluster with the result.

GCP preemptible nodes get ``scheduling: {preemptible: true, automaticRestart: false,
onHostMaintenance: TERMINATE}`` - an object, as in the GCE REST API, not the list form of Ray's example
files, which GCE rejects (ray-project/ray#46248); preemptible (not Spot) VMs live at most 24 h and get the
30 s notice that CM-DARE's lifetime data describe. AWS Spot nodes use
``InstanceMarketOptions: {MarketType: spot}``. Every config passes
``ray.autoscaler._private.util.validate_config``.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cmdare.cloud.catalog import Catalog, Offering
from cmdare.cloud.detection import CLOUD_RAY_CONFIG, WORKER_PRESTART_ENV, system_config_flag
from cmdare.cloud.gpu_counts import DEFAULT_WORKER_GPU, parse_gpu_counts, parse_workers
from cmdare.cloud.launcher_local import local_config, local_start_command
from cmdare.cloud.launcher_names import (
    GPU_LABEL,
    HEAD_RESOURCE,
    HEAD_TYPE,
    LOCAL_HEAD_TYPE,
    PS_RESOURCE,
    PS_TYPE,
    ROLE_LABEL,
    TRANSIENT_LABEL,
    WORKER_RESOURCE,
    gpu_resource,
    worker_type,
)
from cmdare.cloud.launcher_nodes import (
    DEFAULT_GCP_CPU_IMAGE,
    DEFAULT_GCP_GPU_IMAGE,
    GPU_SOFTWARE,
    aws_node_config,
    gcp_gpu_image,
    gcp_node_config,
    gpu_caveat,
)
from cmdare.cloud.launcher_render import node_env, render_yaml
from cmdare.cloud.launcher_setup import (
    AUTH_ENV,
    RAY_TOKEN_PATH,
    STORAGE_ENV,
    checked_storage,
    env_prefix,
    persist_env,
    python_commands,
    ray_install_command,
    resolve_install,
    storage_extras,
)
from cmdare.errors import DataFormatError, UnknownNameError, UserInputError

__all__ = [
    "CLOUDS",
    "DEFAULT_GCP_CPU_IMAGE",
    "DEFAULT_GCP_GPU_IMAGE",
    "DEFAULT_REGIONS",
    "GPU_SOFTWARE",
    "HEAD_TYPE",
    "LOCAL_HEAD_TYPE",
    "PS_RESOURCE",
    "PS_TYPE",
    "WORKER_RESOURCE",
    "cluster_config",
    "gpu_resource",
    "local_start_command",
    "node_env",
    "render_yaml",
    "worker_groups",
    "worker_type",
]

CLOUDS = ("gcp", "aws", "local")
DEFAULT_REGIONS = {"gcp": "us-central1", "aws": "us-east-1"}
_NOTICE_PROVIDERS = {"gcp": "gce", "aws": "aws"}
_LOCAL_ONLY = ("cpus_per_node", "spare_nodes", "head_port")
_CLOUD_ONLY = ("region", "zone", "project_id", "image", "wheel", "cmdare_spec")


def _count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserInputError(f"--{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise UserInputError(f"--{name} must be >= {minimum}, got {value}")
    return value


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)


def worker_groups(catalog: Catalog, gpu: str | None, workers: int | str | Mapping[str, int]) -> list[tuple[str, int]]:
    """``[(GPU type as in the catalog, workers)]`` from ``--workers`` (read by
    :func:`cmdare.cloud.gpu_counts.parse_workers`: a number of ``--gpu``, of :data:`DEFAULT_WORKER_GPU` without
    ``--gpu``, or a mix such as ``k80:2,v100:1``) and ``--gpu``.

    Raises:
        UserInputError: a count below 1, a malformed mix, or ``--gpu`` naming a type the mix does not.
        UnknownNameError: an unknown GPU type.
    """
    counts: Mapping[str, int]
    if isinstance(workers, str):
        parsed = parse_workers(workers, catalog)
        if parsed.mix is None:
            return [(catalog.gpu(gpu or DEFAULT_WORKER_GPU).name, parsed.total)]
        counts = parsed.mix
    elif isinstance(workers, int) and not isinstance(workers, bool):
        return [(catalog.gpu(gpu or DEFAULT_WORKER_GPU).name, _count("workers", workers))]
    elif isinstance(workers, Mapping):
        try:
            counts = parse_gpu_counts(workers, catalog, min_count=1)
        except DataFormatError as err:
            raise UserInputError(f"--workers: {err}") from None
    else:
        raise UserInputError(f"--workers must be a whole number or a mix such as k80:2,v100:1, got {workers!r}")
    groups: dict[str, int] = {}
    for name, count in counts.items():
        canonical = catalog.gpu(name).name
        groups[canonical] = groups.get(canonical, 0) + count
    if gpu is not None and {catalog.gpu(gpu).name} != set(groups):
        raise UserInputError(f"--gpu {gpu} does not match --workers {workers}: a mix names its GPU types, drop --gpu")
    return list(groups.items())


def cluster_config(
    catalog: Catalog,
    cloud: str,
    gpu: str | None = None,
    workers: int | str | Mapping[str, int] = 4,
    ps: int = 1,
    transient: bool = True,
    region: str | None = None,
    zone: str | None = None,
    cluster_name: str | None = None,
    project_id: str | None = None,
    cmdare_spec: str | None = None,
    image: str | None = None,
    *,
    wheel: str | Path | None = None,
    storage: str | None = None,
    force: bool = False,
    cpus_per_node: int | None = None,
    spare_nodes: int | None = None,
    head_port: int | None = None,
    config_path: str | None = None,
    search_dir: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """A Ray cluster-launcher config for the ``workers`` GPU workers and ``ps`` parameter servers.

    Args:
        catalog: where instance types, GPUs per server and zones come from.
        cloud: ``'gcp'``, ``'aws'`` or ``'local'`` (Ray's fake multi-node provider on this machine).
        gpu: GPU type (case-insensitive) when ``workers`` is a number (default T4, ``DEFAULT_WORKER_GPU``).
        workers: training workers (one per GPU): a number of ``gpu``, or a mix ``'k80:2,v100:1'`` /
            ``{'k80': 2}``; servers per type = ceil(workers / GPUs per server) (local: one per worker).
        ps: number of parameter-server nodes (on-demand, CPU only; 0: none, for ``--topology allreduce``).
        transient: preemptible (GCP) / Spot (AWS) GPU workers; needs ``storage`` on a cloud unless ``force``.
        region, zone: cloud region (default ``us-central1`` / ``us-east-1``, or the first region offering every
            GPU type) and zone (GCP: default the first zone offering them all; AWS: Ray chooses).
        cluster_name: Ray cluster name (default ``cmdare-<gpus>-<cloud>``).
        project_id: GCP project (left ``null`` for the user to fill in when not given).
        cmdare_spec: a pip spec of cmdare for the nodes (``cmdare==X`` from the user's index, git+https, a URL).
        image: boot image of the GPU nodes (GCP image, AWS AMI id), instead of the per-GPU default.
        wheel: a local cmdare wheel to copy to and install on every node (default, with no ``cmdare_spec``:
            the newest ``dist/cmdare-<version>-*.whl`` under ``search_dir``, the current directory).
        storage: checkpoint location for every node (``CMDARE_STORAGE``): ``s3://``/``gs://`` (local: also a
            directory).
        force: accept ``transient`` without ``storage``.
        cpus_per_node, spare_nodes, head_port: local only: CPUs of each fake node (default 1), extra nodes per
            type beyond its minimum (default 1), the head's GCS port (default 6379).
        config_path: local only: where the YAML will be written (for the start command).
        warn: called with each warning (default: :func:`warnings.warn`); the CLI prints them on stderr.

    Raises:
        UnknownNameError: unknown cloud, GPU type or region, or a GPU is not offered there.
        UserInputError: bad counts or mixes, a zone outside the region, on-demand for a Spot-only machine type,
            unusable storage, no way to install cmdare, or options of another cloud kind.
    """
    warn = warn or _warn
    ps = _count("ps", ps, 0)  # 0: no PS nodes (an all-reduce run)
    cloud_key = str(cloud).strip().lower()
    if cloud_key not in CLOUDS:
        raise UnknownNameError("cloud", cloud, CLOUDS)
    groups = worker_groups(catalog, gpu, workers)
    given = {"cpus_per_node": cpus_per_node, "spare_nodes": spare_nodes, "head_port": head_port, "region": region,
             "zone": zone, "project_id": project_id, "image": image, "wheel": wheel, "cmdare_spec": cmdare_spec}
    foreign = _LOCAL_ONLY if cloud_key != "local" else _CLOUD_ONLY
    misplaced = [f"--{k.replace('_', '-')}" for k in foreign if given[k] is not None]
    if misplaced:
        which = "--cloud local" if cloud_key != "local" else "a cloud (gcp, aws)"
        raise UserInputError(f"{', '.join(misplaced)}: only for {which}")
    name = cluster_name or f"cmdare-{'-'.join(g.lower() for g, _ in groups)}-{cloud_key}"
    if cloud_key == "local":
        storage = checked_storage(cloud_key, storage, transient=transient, force=force, warn=warn)
        port = _count("head-port", 6379 if head_port is None else head_port)
        if port > 65535:
            raise UserInputError(f"--head-port must be <= 65535, got {port}")
        return local_config(groups, ps, transient, storage,
                            cpus_per_node=_count("cpus-per-node", 1 if cpus_per_node is None else cpus_per_node),
                            spare_nodes=_count("spare-nodes", 1 if spare_nodes is None else spare_nodes, 0),
                            head_port=port, cluster_name=name, config_path=config_path)
    # What the catalog says first (offered? where?), then storage, then how cmdare gets onto the nodes.
    region = region or _default_region(catalog, cloud_key, [g for g, _ in groups])
    offers = {g: catalog.offering(g, cloud_key, region, role="worker") for g, _ in groups}
    ps_off = catalog.offering(None, cloud_key, region, role="ps")
    for g, off in offers.items():
        if off.spot_only and not transient:
            raise UserInputError(f"{off.machine_type} ({g}) is Spot/Flex-start only on {cloud_key}; "
                                 "use --transient or another GPU")
    if cloud_key == "gcp":
        provider: dict[str, Any] = {"type": "gcp", "region": region,
                                    "availability_zone": _gcp_zone(offers, region, zone), "project_id": project_id}
    else:
        provider = {"type": "aws", "region": region, "cache_stopped_nodes": False}
        if zone is not None:
            if not zone.startswith(region):
                raise UserInputError(f"availability zone {zone!r} is not in region {region!r}")
            provider["availability_zone"] = zone
    storage = checked_storage(cloud_key, storage, transient=transient, force=force, warn=warn)
    install = resolve_install(wheel=wheel, cmdare_spec=cmdare_spec, extras=storage_extras(storage),
                              search_dir=search_dir, warn=warn)
    for g in offers:
        if gpu_caveat(g):
            warn(gpu_caveat(g))

    env = {**AUTH_ENV, **({STORAGE_ENV: storage} if storage else {})}
    setup = [*python_commands(), *persist_env(env), ray_install_command(), *install.commands]
    notice_env = {"CMDARE_NOTICE_PROVIDER": _NOTICE_PROVIDERS[cloud_key], "CMDARE_TRANSIENT": str(int(transient))}
    if cloud_key == "gcp":
        cpu_node = gcp_node_config(ps_off, DEFAULT_GCP_CPU_IMAGE, transient=False)
        gpu_nodes = {g: gcp_node_config(off, image or gcp_gpu_image(g), transient) for g, off in offers.items()}
        head_setup = ["pip install -U google-api-python-client"]
    else:
        cpu_node = aws_node_config(ps_off, transient=False)
        gpu_nodes = {g: aws_node_config(off, transient, image) for g, off in offers.items()}
        head_setup = ["pip install -U 'boto3>=1.4.8'"]  # 1.4.8 adds InstanceMarketOptions

    types: dict[str, Any] = {
        HEAD_TYPE: {"max_workers": 0, "resources": {"CPU": ps_off.vcpus, HEAD_RESOURCE: 1},
                    "labels": {ROLE_LABEL: "head"}, "node_config": cpu_node},
    }
    if ps:
        types[PS_TYPE] = {"min_workers": ps, "max_workers": ps, "resources": {"CPU": ps_off.vcpus, PS_RESOURCE: 1},
                          "labels": {ROLE_LABEL: "ps"}, "node_config": copy.deepcopy(cpu_node)}
    for g, count in groups:
        off = offers[g]
        nodes, slots = math.ceil(count / off.gpus_per_server), off.gpus_per_server
        types[worker_type(g)] = {
            "min_workers": nodes, "max_workers": nodes,
            "resources": {"CPU": off.vcpus, "GPU": slots, WORKER_RESOURCE: slots, gpu_resource(g): slots},
            "labels": {ROLE_LABEL: "worker", GPU_LABEL: g, TRANSIENT_LABEL: str(transient).lower()},
            "worker_setup_commands": setup + persist_env(notice_env),
            "node_config": gpu_nodes[g],
        }
    exports = env_prefix(env)
    return {
        "cluster_name": name,
        "max_workers": sum(t.get("max_workers", 0) for n, t in types.items() if n != HEAD_TYPE),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "provider": provider,
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": types,
        "head_node_type": HEAD_TYPE,
        # remote path: local path. The token authenticates every Ray connection; the wheel is cmdare.
        "file_mounts": {RAY_TOKEN_PATH: RAY_TOKEN_PATH, **install.file_mounts},
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
            f"{exports}; ulimit -n 65536; ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=127.0.0.1 "
            + system_config_flag(CLOUD_RAY_CONFIG),
        ],
        "worker_start_ray_commands": [
            "ray stop",
            # worker nodes prestart their worker processes with torch imported (a replacement's actor starts warm)
            f"{env_prefix({**env, **WORKER_PRESTART_ENV})}; ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 "
            "--object-manager-port=8076",
        ],
    }


def _default_region(catalog: Catalog, cloud: str, gpus: list[str]) -> str:
    preferred = DEFAULT_REGIONS[cloud]
    per_gpu = {g: {o.region for o in catalog.find(gpu=g, cloud=cloud, role="worker")} for g in gpus}
    if any(not regions for regions in per_gpu.values()):
        return preferred  # catalog.offering() reports "not offered" with the clouds that do offer it
    common = set.intersection(*per_gpu.values())
    if preferred in common:
        return preferred
    if not common:
        where = "; ".join(f"{g}: {', '.join(sorted(r))}" for g, r in per_gpu.items())
        raise UserInputError(f"no {cloud} region offers all of {', '.join(gpus)} ({where}); split the mix")
    return sorted(common)[0]


def _gcp_zone(offers: dict[str, Offering], region: str, zone: str | None) -> str:
    listed = {g: off.zones for g, off in offers.items() if off.zones}
    if zone is not None:
        if not zone.startswith(region + "-"):
            raise UserInputError(f"zone {zone!r} is not in region {region!r}")
        for g, zones in listed.items():
            if zone not in zones:
                raise UnknownNameError(f"{region} zone with {g} GPUs", zone, zones)
        return zone
    if not listed:
        return f"{region}-a"
    first = next(iter(listed.values()))
    common = [z for z in first if all(z in zones for zones in listed.values())]
    if not common:
        where = "; ".join(f"{g}: {', '.join(z)}" for g, z in listed.items())
        raise UserInputError(f"no {region} zone offers all of {', '.join(listed)} ({where}); split the mix")
    return common[0]
