"""Run one benchmark script the way ``python bench/NAME.py ARGS`` does, up to its Ray start, and report where
Ray's nodes run.

Usage: python tests/bench/ray_probe.py bench/NAME.py [ARGS...]

Nothing Ray-related is imported or set here before the bench runs, so the bench's own environment variables
and import order decide how Ray resolves its addresses. An import hook only wraps ``ray.init`` once the
bench (or something it imports) has imported Ray. The bench's first ``ray.init`` starts or joins Ray exactly
as the bench asked; the wrapper then prints one line ``RAY_PROBE {json}`` with every node's
``NodeManagerAddress``, shuts down the Ray it started (and any ``ray.cluster_utils.Cluster`` the bench
built) and exits with status 0, so the bench's measurements never run.
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

MARKER = "RAY_PROBE "


def _report_and_exit(ray: Any, context: Any) -> None:
    try:
        from ray._private import ray_constants

        enable_cluster = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    except ImportError:
        enable_cluster = None
    info = getattr(context, "address_info", None) or {}
    report = {
        "nodes": [{"NodeManagerAddress": n["NodeManagerAddress"], "Alive": n["Alive"]} for n in ray.nodes()],
        "gcs_address": info.get("gcs_address"),
        "env_RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
        "ray_ENABLE_RAY_CLUSTER": enable_cluster,
    }
    print(MARKER + json.dumps(report), flush=True)
    ray.shutdown()
    cluster_utils = sys.modules.get("ray.cluster_utils")
    if cluster_utils is not None:  # a multi-node bench: its head and worker nodes are not the driver's
        for obj in gc.get_objects():
            if isinstance(obj, cluster_utils.Cluster):
                obj.shutdown()
    raise SystemExit(0)


def _wrap_init(ray: Any) -> None:
    init = ray.init

    @functools.wraps(init)
    def probe_init(*args: Any, **kwargs: Any) -> Any:
        _report_and_exit(ray, init(*args, **kwargs))

    ray.init = probe_init


class _AfterRayImport(importlib.abc.MetaPathFinder):
    """Finds ``ray`` like the normal path finder and wraps ``ray.init`` once ``ray/__init__`` has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "ray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("ray")
        exec_module = spec.loader.exec_module

        def exec_then_wrap(module: Any) -> None:
            exec_module(module)
            _wrap_init(module)

        spec.loader.exec_module = exec_then_wrap
        return spec


def main() -> None:
    script = Path(sys.argv[1]).resolve()
    if "ray" in sys.modules:
        raise SystemExit("ray_probe: Ray was imported before the bench")
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.parent)  # as `python bench/NAME.py` sets it
    sys.meta_path.insert(0, _AfterRayImport())
    runpy.run_path(str(script), run_name="__main__")
    raise SystemExit("ray_probe: the bench ended without calling ray.init")


if __name__ == "__main__":
    main()
