"""Every benchmark's Ray runs on 127.0.0.1, like ``cmdare train``'s.

Ray resolves ``_node_ip_address="127.0.0.1"`` to the machine's interface address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before Ray is imported. Whether a bench gets that right
depends on its own import order, so each bench runs in a fresh process (``ray_probe.py``) as
``python bench/NAME.py`` would, without the variable this test session set (tests/conftest.py), up to its
first ``ray.init``: the probe reports each node's ``NodeManagerAddress`` and stops there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = ROOT / "bench"
PROBE = Path(__file__).resolve().parent / "ray_probe.py"
LOOPBACK = "127.0.0.1"

# Every bench that starts Ray, with arguments that make the work it does before Ray starts small.
BENCHES: dict[str, list[str]] = {
    "accuracy_runs": [],
    "allreduce": [],  # its rendezvous store and DDP processes start after Ray
    "checkpoint_stall": [],  # starts its moto server (a child process) after Ray
    "mitigation": [],
    "overlap": [],
    "ps_datapath": ["--mb", "0.1"],  # starts its 2 gloo processes before Ray
    "ps_scaling": ["--workers", "1"],  # no gloo processes before Ray
    "psld": [],
    "revocation": [],  # a multi-node ray.cluster_utils.Cluster
    "scaling": [],
    "shard_memory": [],
    "sim_vs_real": [],
    "spot_ps": ["--quick"],
    "store_recording": ["--rows", "10", "--pairs", "1", "--train-steps", "1"],  # rows recorded before Ray
    "train_overhead": [],
}
# Benches that start Ray only on a CUDA machine (without one they print `skipped` first: nothing to probe);
# they still start it through cmdare.train.run.ray_session (the RAW_START check below covers them).
CUDA_ONLY = {"gpu_smoke"}
STARTS_RAY = re.compile(r"\bray\.init\(|\bCluster\(|\bstart_local_ray\(|\bstart_local_cluster\(")
RAW_START = re.compile(r"\bray\.init\(|\bCluster\(")
TIMEOUT_S = 120


def _bench_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",  # set by tests/conftest.py: the bench must set it itself
        "RAY_ADDRESS", "CMDARE_BENCH_PG_URL", "CMDARE_TEST_PG_URL")}


def _probe(name: str) -> dict:
    """Run one bench up to its Ray start in a fresh process; the probe's report."""
    proc = subprocess.run([sys.executable, str(PROBE), str(BENCH_DIR / f"{name}.py"), *BENCHES[name]],
                          cwd=ROOT, env=_bench_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RAY_PROBE ")]
    if proc.returncode != 0 or len(lines) != 1:
        return {"error": f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"}
    return json.loads(lines[0].removeprefix("RAY_PROBE "))


def _selected(request) -> list[str]:
    """The benches whose loopback test this session runs (``-k`` may deselect some)."""
    names = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is request.module and "bench" in params:
            names.append(params["bench"])
    return names


@pytest.fixture(scope="module")
def probes(request) -> dict[str, dict]:
    """The selected benches' reports, 2 probes at a time (each is mostly waiting for Ray's processes)."""
    wanted = _selected(request)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(wanted, pool.map(_probe, wanted), strict=True))


def test_every_bench_that_starts_ray_is_probed_and_uses_the_loopback_helpers():
    """New benches that start Ray are added to BENCHES; they start it through cmdare.train.run.ray_session."""
    starting = {p.stem for p in BENCH_DIR.glob("*.py") if STARTS_RAY.search(p.read_text())}
    assert starting == set(BENCHES) | CUDA_ONLY
    raw = {p.stem for p in BENCH_DIR.glob("*.py") if RAW_START.search(p.read_text())}
    assert not raw, f"start Ray with cmdare.train.run.ray_session.start_local_ray / start_local_cluster: {sorted(raw)}"


def test_start_local_ray_refuses_a_ray_imported_too_early():
    """Ray imported before cmdare.train.run.ray_session would resolve 127.0.0.1 to the machine's address: an error,
    before any Ray process starts."""
    code = "import ray\nfrom cmdare.train.run.ray_session import start_local_ray\nstart_local_ray(num_cpus=1)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_bench_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "ClusterError" in proc.stderr and "127.0.0.1" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.cluster  # make test-cluster: every bench up to its Ray start
@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_bench_ray_runs_on_loopback(bench, probes):
    report = probes[bench]
    assert "error" not in report, report.get("error")
    addresses = [n["NodeManagerAddress"] for n in report["nodes"]]
    assert addresses, report
    assert all(a == LOOPBACK for a in addresses), f"{bench}: Ray nodes on {addresses}: {report}"
    assert report["gcs_address"] is None or report["gcs_address"].startswith(LOOPBACK + ":"), report


def test_gpu_smoke_skips_cleanly_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: bench/gpu_smoke.py runs for real")
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "gpu_smoke.py")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"bench": "gpu_smoke", "skipped": True,
                                                                 "reason": "no CUDA device"}
