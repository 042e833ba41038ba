"""The Ray settings cmdare starts Ray with: how fast a silent node is declared dead (revocation detection
without a notice), and how large an object may travel inside a call."""

from __future__ import annotations

import json

#: How fast Ray's GCS declares a silent node dead (a revoked server that got no notice). Ray's default
#: health check (every 3 s, 10 s timeout, 5 misses) is tuned for large clusters; a Ray instance cmdare
#: starts on one machine (loopback, no jitter) checks every 200 ms and gives up after 2 misses, so a
#: killed node is known to be dead in ~0.3 s (bench/revocation.py). Pass it as ``_system_config`` to
#: the head of a local multi-node cluster (``Cluster(head_node_args={"_system_config": ...})``).
LOCAL_FAILURE_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 200,
                           "health_check_timeout_ms": 300, "health_check_failure_threshold": 2}
#: The same for a cloud cluster (``cmdare cluster-config``): network jitter makes sub-second checks
#: mark live nodes dead, so a check every second with 3 misses (~3-4 s); revocations announced by a
#: preemption notice are handled before the node dies anyway.
CLOUD_FAILURE_DETECTION = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
                           "health_check_failure_threshold": 3}

#: Objects up to 1 MiB travel inside Ray's call messages instead of through the object store (Ray's default
#: is 100 KiB): a push and pull of a small model across nodes is then one plain round trip (312 KB: 4.2 ->
#: 2.0 ms measured). Larger ones stay in the object store (10 MB inlined took 42 ms).
INLINE_OBJECTS = {"max_direct_call_object_size": 1 << 20}
#: Ray starts its worker processes at niceness 15, below everything else on the machine. The training
#: processes are the job: on a machine shared with other work, niceness 15 starved them (one core shared
#: with a busy loop: 670 ms of compute per step against 16 ms idle, `cmdare train` 32x slower than idle).
#: Only for the instance ``cmdare train`` starts itself; a cluster it joins keeps the cluster's setting.
TRAINING_PRIORITY = {"worker_niceness": 0}
#: What cmdare gives Ray's ``_system_config`` / ``ray start --system-config`` on this machine and on a cloud.
#: The single-node instance ``cmdare train`` starts keeps Ray's default health checks: its servers are worker
#: processes, revoked by killing them, so its one node going silent is no revocation to detect; fast checks
#: only made a loaded machine's own node be marked dead, taking the run with it.
LOCAL_RAY_CONFIG = {**INLINE_OBJECTS, **TRAINING_PRIORITY}
#: A local multi-node cluster (``cmdare cluster-config --cloud local``): there a revoked server is a node, and
#: its death is what must be detected fast.
LOCAL_CLUSTER_RAY_CONFIG = {**LOCAL_FAILURE_DETECTION, **INLINE_OBJECTS}
CLOUD_RAY_CONFIG = {**CLOUD_FAILURE_DETECTION, **INLINE_OBJECTS}

#: What a worker server's worker process must import before it can train (torch ~1 s of a cold start).
PRELOADED_MODULES = ("torch", "cmdare.train.workers.warm_pool")
#: The environment of a worker node's raylet: it starts one Python worker process per CPU as the node comes up
#: (``enable_worker_prestart``), each importing :data:`PRELOADED_MODULES` before it accepts work
#: (``preload_python_modules``), so the worker actor placed there finds its process up with torch imported
#: (bench/revocation.py: actor start 0.01 s on a node up for a second, against 1.35 s cold).
WORKER_PRESTART_ENV = {"RAY_enable_worker_prestart": "1", "RAY_preload_python_modules": ",".join(PRELOADED_MODULES)}


def system_config_flag(config: dict[str, int]) -> str:
    """``ray start`` flag that applies ``config`` (``--system-config='{...}'``)."""
    return f"--system-config='{json.dumps(config, separators=(',', ':'))}'"
