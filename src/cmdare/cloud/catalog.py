"""The server catalog: GPU types and what a worker or parameter server costs, per cloud and region.

This module gathers the catalog API in one place; the code lives in two modules with one job each:

* :mod:`cmdare.cloud.catalog_model` - :class:`Catalog`, :class:`GpuType`, :class:`Offering` and the
  look-ups and prices (per worker slot or per PS server) a catalog answers;
* :mod:`cmdare.cloud.catalog_loader` - :func:`load_catalog`: the shipped ``data/catalog.yaml`` merged
  with a user file (``load_catalog(path)``, ``$CMDARE_CATALOG`` or ``--catalog FILE``) and validated;
  :func:`default_catalog` caches it and :func:`gpu_tflops` reads one GPU's throughput from it.
"""

from __future__ import annotations

from cmdare.cloud.catalog_loader import CATALOG_ENV, builtin_catalog_path, default_catalog, gpu_tflops, load_catalog
from cmdare.cloud.catalog_model import Catalog, GpuType, NotOfferedError, Offering

__all__ = [
    "CATALOG_ENV",
    "Catalog",
    "GpuType",
    "NotOfferedError",
    "Offering",
    "builtin_catalog_path",
    "default_catalog",
    "gpu_tflops",
    "load_catalog",
]
