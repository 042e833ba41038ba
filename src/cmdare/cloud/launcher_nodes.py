"""Per-cloud node configs and per-GPU boot images of the cluster-launcher configs (:mod:`cmdare.cloud.launcher`).

A GPU worker needs an NVIDIA driver that supports its GPU *and* the CUDA of the PyTorch build cmdare
installs. :data:`GPU_SOFTWARE` says, per GPU type of the catalog, which GCP image family to boot and
what the default software lacks (a caveat shown in the YAML header and on stderr).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

from cmdare.cloud.catalog_model import Offering

__all__ = [
    "AWS_DEFAULT_AMI_NOTE",
    "DEFAULT_GCP_CPU_IMAGE",
    "DEFAULT_GCP_GPU_IMAGE",
    "GPU_SOFTWARE",
    "GpuSoftware",
    "aws_node_config",
    "gcp_gpu_image",
    "gcp_node_config",
    "gpu_caveat",
]

DISK_GB = 100
_DLVM = "projects/deeplearning-platform-release/global/images/family/"
# Ray's own GCP defaults use this CPU image family (ray/autoscaler/gcp/defaults.yaml).
DEFAULT_GCP_CPU_IMAGE = _DLVM + "common-cpu"
# A CUDA 12 family of Google's Deep Learning VM images (driver R570). Families are renamed over time: check
# with `gcloud compute images list --project deeplearning-platform-release --no-standard-images` and pass
# --image to override.
DEFAULT_GCP_GPU_IMAGE = _DLVM + "common-cu128-ubuntu-2204-nvidia-570"
# Ray 2.60 fills in this AMI when a node config has no ImageId (ray/autoscaler/_private/aws/config.py).
AWS_DEFAULT_AMI_NOTE = ("No ImageId: Ray picks its default AMI, 'AWS Deep Learning AMI (Ubuntu 18.04) V71.0', whose "
                        "NVIDIA driver may predate the CUDA 12 builds of torch; pass --image ami-... with a current "
                        "Deep Learning Base AMI (AWS: 'Finding the ID of a DLAMI').")


def _torch_pin() -> str:
    """cmdare's torch requirement as installed (e.g. ``torch==2.13.0``), for the caveats."""
    try:
        reqs = metadata.requires("cmdare") or []
    except metadata.PackageNotFoundError:
        reqs = []
    pins = [r.split(";")[0].strip() for r in reqs if r.replace(" ", "").lower().startswith("torch")]
    return pins[0] if pins else "a current torch"


@dataclass(frozen=True)
class GpuSoftware:
    """What one GPU type needs from the boot image: its compute capability, a GCP image family (None: the
    default CUDA 12 family) and what the default software lacks (``{torch}`` stands for cmdare's torch pin)."""

    compute_capability: str
    gcp_image: str | None = None
    caveat: str = ""


_OLD_ARCH = ("{gpu} (compute capability {cc}): PyTorch 2.11 and later dropped sm_60/sm_70 from their CUDA 12.8+ "
             "wheels (dev-discuss.pytorch.org: 'Dropping Volta support from CUDA-12.8 binaries for release 2.11'); "
             "if `python -c \"import torch; torch.zeros(1).cuda()\"` fails on a worker, install {torch} from the "
             "CUDA 12.6 index (https://download.pytorch.org/whl/cu126) there, or choose T4, L4 or A100.")

# Per GPU type: compute capability (developer.nvidia.com/cuda-gpus), the Deep Learning VM image family whose
# driver supports it (cloud.google.com/deep-learning-vm/docs/images: K80 needs the R470 driver, the last with
# Kepler support, which only the CUDA 11.x families ship) and the caveat of the default software.
GPU_SOFTWARE: dict[str, GpuSoftware] = {
    "K80": GpuSoftware(
        "3.7", _DLVM + "common-cu113-debian-10",
        "K80 (compute capability 3.7): CUDA 12 does not support it and current PyTorch wheels ({torch} for cmdare) "
        "lack sm_37 kernels, so training on these workers cannot use the GPU: pin an older torch built for CUDA "
        "11.x with sm_37 on these nodes (cmdare is untested there) or choose another GPU (T4, L4, A100)."),
    "P100": GpuSoftware("6.0", None, _OLD_ARCH),
    "V100": GpuSoftware("7.0", None, _OLD_ARCH),
    "T4": GpuSoftware("7.5"),
    "L4": GpuSoftware("8.9"),
    "A100": GpuSoftware("8.0"),
    "H100": GpuSoftware("9.0"),
}


def gcp_gpu_image(gpu: str) -> str:
    """The GCP boot image of GPU type ``gpu`` (its CUDA 11 family for K80, else the default CUDA 12 family)."""
    software = GPU_SOFTWARE.get(gpu)
    return (software.gcp_image if software else None) or DEFAULT_GCP_GPU_IMAGE


def gpu_caveat(gpu: str) -> str:
    """What the default software lacks for GPU type ``gpu`` (empty when nothing)."""
    software = GPU_SOFTWARE.get(gpu)
    if software is None or not software.caveat:
        return ""
    return software.caveat.format(gpu=gpu, cc=software.compute_capability, torch=_torch_pin())


def gcp_node_config(off: Offering, image: str, transient: bool) -> dict[str, Any]:
    """A GCE ``node_config``: machine type, boot disk, attached GPUs and scheduling."""
    disk = {"boot": True, "autoDelete": True, "type": "PERSISTENT",
            "initializeParams": {"diskSizeGb": DISK_GB, "sourceImage": image}}
    node: dict[str, Any] = {"machineType": off.machine_type, "disks": [disk]}
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


def aws_node_config(off: Offering, transient: bool, image: str | None = None) -> dict[str, Any]:
    """An EC2 ``node_config``: instance type, root volume, Spot market options and an optional AMI."""
    node: dict[str, Any] = {
        "InstanceType": off.machine_type,
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": DISK_GB}}],
    }
    if image:
        node["ImageId"] = image
    if transient:
        node["InstanceMarketOptions"] = {"MarketType": "spot"}
    return node
