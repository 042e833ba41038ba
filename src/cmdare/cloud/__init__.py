"""cmdare.cloud: servers and their prices, preemption notices, and Ray cluster-launcher configs.

* :mod:`cmdare.cloud.catalog` - GPU types and per-region on-demand/spot prices (a shipped data file
  with sources, overridable by the user);
* :mod:`cmdare.cloud.servers` - :class:`ServerSpec` and per-second :func:`cost_usd`;
* :mod:`cmdare.cloud.notices` - :class:`NoticeWatcher` for GCE/AWS preemption notices and
  :class:`LocalMetadataServer`, a local endpoint that emulates them;
* :mod:`cmdare.cloud.launcher` - Ray cluster-launcher YAML for GCP preemptible / AWS Spot workers;
* :mod:`cmdare.cloud.detection` - how fast Ray declares a silent (revoked) node dead.
"""

from cmdare.cloud.catalog import Catalog, GpuType, NotOfferedError, Offering, gpu_tflops, load_catalog
from cmdare.cloud.notices import LocalMetadataServer, Notice, NoticeWatcher
from cmdare.cloud.servers import ServerSpec, cost_usd

__all__ = [
    "Catalog",
    "GpuType",
    "LocalMetadataServer",
    "Notice",
    "NoticeWatcher",
    "NotOfferedError",
    "Offering",
    "ServerSpec",
    "cost_usd",
    "gpu_tflops",
    "load_catalog",
]
