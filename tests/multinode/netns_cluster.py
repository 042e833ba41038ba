"""A real multi-node Ray cluster (``ray start``) inside a network namespace that holds only loopback.

On the host, Ray resolves 127.0.0.1 to the machine's interface address for joined nodes; in a namespace of
its own loopback is all there is, so every node, driver and worker talks over 127.0.0.1.

A holder process (``unshare --net --pid --fork --mount-proc``) owns the namespaces: it is PID 1 of the new
PID namespace, so SIGKILL to it kills everything started inside, and nothing outside is ever touched. Every
command runs inside with ``nsenter``. Each worker node gets a private ``CMDARE_HOME`` (its own "disk") and
its own Ray ``--temp-dir``; :meth:`NetnsCluster.kill_worker_node` kills that node's processes (found by
their ``CMDARE_HOME`` in ``/proc/PID/environ``, and their descendants) and deletes its home, as a revoked VM
loses its disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
RAY, CMDARE, PYTHON = str(BIN / "ray"), str(BIN / "cmdare"), sys.executable
LOOPBACK = "127.0.0.1"
# Pass as start_cluster(env=...) to have the GCS mark a killed node dead in ~1 s instead of ~15 s.
FAST_NODE_DEATH = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "500",
                   "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}

# The holder, PID 1 inside: reaps the orphans `ray start` leaves (daemons, killed nodes) and never exits.
_REAPER = "import os, time\nwhile True:\n    try: os.wait()\n    except ChildProcessError: time.sleep(0.5)"
# Polls, inside the namespace, until the cluster shows exactly `want` worker nodes; prints the resources.
_WAIT_NODES = """
import json, sys, time, ray
address, want, deadline = sys.argv[1], float(sys.argv[2]), time.time() + float(sys.argv[3])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while (res := ray.cluster_resources()).get("cmdare_worker", 0) != want and time.time() < deadline:
    time.sleep(0.2)
print(json.dumps(res))
sys.exit(0 if res.get("cmdare_worker", 0) == want else 3)
"""
# Prints [actor class, state, node name] of every actor the cluster has seen (named by the node's temp dir).
_ACTOR_NODES = """
import json, pathlib, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
node = {n["NodeID"]: pathlib.Path(n["ObjectStoreSocketName"]).parents[2].name for n in ray.nodes()}
print(json.dumps(sorted([a["ActorClassName"], a["State"], node.get(a["Address"]["NodeID"], "?")]
                        for a in ray._private.state.actors().values())))
"""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, even without a teardown."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def netns_available() -> str | None:
    """None if this machine lets us make the namespaces, else why not (a skip reason)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare/nsenter not found"
    try:
        proc = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if proc.returncode == 0 else f"unshare --net not permitted: {proc.stderr.strip()}"


# the token of every namespace cluster this test session starts where the user has none (Ray 2.60 reads
# RAY_AUTH_TOKEN before ~/.ray/auth_token); a clean machine has no ~/.ray, and `cluster-config --cloud local`
# configs run Ray with token authentication
_TEST_TOKEN = secrets.token_hex(32)


def ray_env() -> dict[str, str]:
    """Environment variables every Ray process and driver inside the namespace needs."""
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",  # with 0, `ray start --address` refuses loopback
           "RAY_USAGE_STATS_ENABLED": "0"}
    if (Path.home() / ".ray" / "auth_token").exists():  # Ray 2.60 then turns token auth on
        env["RAY_AUTH_MODE"] = "token"
    elif not os.environ.get("RAY_AUTH_TOKEN"):  # a clean machine: the cluster configs' token auth, with our token
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=_TEST_TOKEN)
    return env


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _kill(pids: list[int]) -> None:
    """Stop every process, then kill them all: a VM revoked without notice dies at one instant. Killed one by one
    (in PID order, which wraps around on a long-running host), a node's worker could die while its raylet still
    ran, and the raylet then told the GCS that the worker's resources were free: Ray's autoscaler, which counts a
    dead node's last report, saw room on the dead node for the replacement and launched nothing."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


class NetnsCluster:
    """A network + PID + mount namespace with loopback only, optionally holding a ``ray start`` cluster.

    ``tmp``: root of the per-cluster dirs; ``head_home``, ``node_homes``: each node's ``CMDARE_HOME``;
    ``address``: ``127.0.0.1:PORT``; ``holder_pid``: host PID of the namespace's PID 1; ``killed``: the
    indices of worker nodes :meth:`kill_worker_node` removed.
    """

    def __init__(self, tmp: Path, port: int = 6379) -> None:
        self.tmp, self.port, self.address = Path(tmp), port, f"{LOOPBACK}:{port}"
        self.head_home = self.tmp / "head"
        self.node_homes: list[Path] = []
        self.killed: set[int] = set()
        # Ray's temp dirs hold Unix sockets (paths of at most 107 bytes): keep them short, apart from tmp.
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="nsray-", dir="/tmp"))
        self.holder_pid, self.node_cpus = 0, 1
        self._ray_env: dict[str, str] = {}
        self._unshare: subprocess.Popen[str] | None = None
        self._popens: list[subprocess.Popen[Any]] = []

    def start_namespace(self, timeout: float = 30.0) -> NetnsCluster:
        """Start the holder; returns once ``lo`` is up inside and the holder's host PID is known."""
        self._unshare = subprocess.Popen(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
             "bash", "-c", f"ip link set lo up && echo ready && exec {PYTHON} -c '{_REAPER}'"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            preexec_fn=_die_with_parent)
        assert self._unshare.stdout is not None
        line = self._unshare.stdout.readline() if select.select([self._unshare.stdout], [], [], timeout)[0] else ""
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children").read_text().split()
        if line.strip() != "ready" or len(children) != 1:
            self.close()
            raise RuntimeError(f"namespace holder did not come up: {line!r}, children {children}")
        self.holder_pid = int(children[0])
        return self

    def _argv(self, args: list[str]) -> list[str]:
        if not self.holder_pid:
            raise RuntimeError("namespace not started")
        return ["nsenter", "--target", str(self.holder_pid), "--net", "--pid", "--mount", "--", *args]

    def run(self, args: list[str], env: dict[str, str] | None = None, timeout: float | None = 300,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``args`` inside (environment: ours + :func:`ray_env` + ``env``); capture its output as text."""
        return subprocess.run(self._argv(args), env={**os.environ, **ray_env(), **(env or {})},
                              capture_output=True, text=True, timeout=timeout, check=check)

    def popen(self, args: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[Any]:
        """Start ``args`` inside (environment as :meth:`run`); it dies at :meth:`close` at the latest."""
        proc = subprocess.Popen(self._argv(args), env={**os.environ, **ray_env(), **(env or {})}, **kw)
        self._popens.append(proc)
        return proc

    def start_cluster(self, workers: int, head_cpus: int = 3, ps_slots: int = 4, node_cpus: int = 1,
                      env: dict[str, str] | None = None, timeout: float = 120.0) -> NetnsCluster:
        """``ray start`` a head (``cmdare_ps``) and ``workers`` worker nodes (``cmdare_worker``); wait for all.

        ``env`` goes to every Ray process (e.g. :data:`FAST_NODE_DEATH`); each also gets its node's home.
        """
        if not self.holder_pid:
            self.start_namespace()
        self._ray_env = dict(env or {})
        self._ray_start("head", self.head_home, ["--head", "--port", str(self.port), "--include-dashboard", "false",
                        "--num-cpus", str(head_cpus), "--resources", json.dumps({"cmdare_ps": ps_slots})])
        self.node_cpus, first = node_cpus, len(self.node_homes)
        self.node_homes += [self.tmp / f"node-{i}" for i in range(first, first + workers)]
        for i in range(first, first + workers):
            self._start_worker_node(i)
        self.wait_for_workers(workers, timeout)
        return self

    def start_plain_head(self, cpus: int = 2) -> NetnsCluster:
        """``ray start --head`` with no cmdare resource: a Ray cluster that cmdare did not start."""
        if not self.holder_pid:
            self.start_namespace()
        self._ray_env = {}
        self._ray_start("head", self.head_home, ["--head", "--port", str(self.port), "--include-dashboard", "false",
                        "--num-cpus", str(cpus)])
        return self

    def start_autoscaling_head(self, command: str, env: dict[str, str] | None = None) -> NetnsCluster:
        """Run ``command``: the ``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=...`` line a
        ``cmdare cluster-config --cloud local`` config names (with a temp dir of ours). Ray's autoscaler, with
        its fake multi-node provider, then launches the config's nodes as local raylets (each with
        ``RAY_OVERRIDE_NODE_ID_FOR_TESTING`` set to its node id) and replaces them on demand.
        """
        if not self.holder_pid:
            self.start_namespace()
        self._ray_env = dict(env or {})
        self.head_home.mkdir(parents=True, exist_ok=True)
        line = f"{command} --temp-dir {self.ray_tmp / 'head'} --disable-usage-stats"
        proc = self.run(["bash", "-c", line], env={**self._ray_env, "CMDARE_HOME": str(self.head_home),
                                                   "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"{line} failed rc={proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
                               f"{self.logs_tail()}")
        return self

    def fake_node_pids(self, node_id: str) -> list[int]:
        """Host PIDs of the fake provider's node ``node_id`` (its raylet, agents and workers)."""
        return self._marked_pids(f"RAY_OVERRIDE_NODE_ID_FOR_TESTING={node_id}".encode())

    def freeze_autoscaler(self) -> list[int]:
        """SIGSTOP Ray's autoscaler (the head's ``autoscaler/_private/monitor.py``; not the nodes' ``log_monitor.py``):
        from now on no node is launched, as when the cloud has no capacity. The nodes it started go on (they are its
        children, not stopped with it)."""
        pids = [pid for pid in self._ns_procs() if b"autoscaler/_private/monitor.py" in _cmdline(pid)]
        if not pids:
            raise RuntimeError("no autoscaler (monitor.py) in the namespace")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def kill_fake_node(self, node_id: str) -> list[int]:
        """SIGKILL every process of the fake provider's node ``node_id`` (a VM revoked without notice)."""
        killed, deadline = [], time.time() + 10
        while pids := self.fake_node_pids(node_id):
            if time.time() > deadline:
                raise RuntimeError(f"node {node_id} processes survive SIGKILL: {pids}")
            _kill(pids)
            killed += [p for p in pids if p not in killed]
            time.sleep(0.1)
        if not killed:
            raise RuntimeError(f"no processes found for node {node_id}")
        return killed

    def add_worker_node(self, timeout: float = 120.0) -> int:
        """Start one more worker node (as a replacement VM would join); returns its index once it shows."""
        self.node_homes.append(self.tmp / f"node-{len(self.node_homes)}")
        self._start_worker_node(len(self.node_homes) - 1)
        self.wait_for_workers(len(self.node_homes) - len(self.killed), timeout)
        return len(self.node_homes) - 1

    def _start_worker_node(self, i: int) -> None:
        self._ray_start(f"node-{i}", self.node_homes[i], ["--address", self.address, "--num-cpus",
                        str(self.node_cpus), "--resources", json.dumps({"cmdare_worker": 1})])

    def _ray_start(self, name: str, home: Path, args: list[str]) -> None:
        home.mkdir(parents=True, exist_ok=True)
        argv = [RAY, "start", "--temp-dir", str(self.ray_tmp / name), "--node-ip-address", LOOPBACK,
                "--disable-usage-stats", *args]
        proc = self.run(argv, env={**self._ray_env, "CMDARE_HOME": str(home)}, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed rc={proc.returncode}:\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}\n{self.logs_tail()}")

    def wait_for_workers(self, count: int, timeout: float = 120.0) -> dict[str, float]:
        """Wait until the cluster shows exactly ``count`` ``cmdare_worker`` nodes; returns its resources."""
        proc = self.run([PYTHON, "-c", _WAIT_NODES, self.address, str(count), str(timeout)],
                        env={"CMDARE_HOME": str(self.tmp / "driver")}, timeout=timeout + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"cluster did not reach {count} worker nodes (rc={proc.returncode}):\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}\n{self.logs_tail()}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def actor_nodes(self) -> list[tuple[str, str, str]]:
        """``(actor class, state, node)`` of each actor so far (dead ones too); node: ``head`` or ``node-I``."""
        proc = self.run([PYTHON, "-c", _ACTOR_NODES, self.address], env={"CMDARE_HOME": str(self.tmp / "driver")})
        if proc.returncode != 0:
            raise RuntimeError(f"listing actors failed:\n{proc.stderr[-3000:]}")
        return [tuple(a) for a in json.loads(proc.stdout.strip().splitlines()[-1])]

    def logs_tail(self, lines: int = 15) -> str:
        """The last lines of each node's raylet/GCS/monitor logs (for error messages)."""
        out = []
        for log in sorted(self.ray_tmp.glob("*/session_latest/logs/*")):
            if log.name.split(".")[0] in ("raylet", "gcs_server", "monitor") and log.stat().st_size:
                text = [t for t in log.read_text(errors="replace").splitlines() if not t.startswith("[state-dump]")]
                out.append(f"--- {log.relative_to(self.ray_tmp)}\n" + "\n".join(text[-lines:]))
        return "\n".join(out) or "(no ray logs)"

    def _ns_procs(self) -> dict[int, int]:
        """``{host pid: host ppid}`` of every process in the namespace's PID namespace."""
        ns, procs = os.readlink(f"/proc/{self.holder_pid}/ns/pid"), {}
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and os.readlink(entry / "ns" / "pid") == ns:
                    procs[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                continue
        return procs

    def node_pids(self, i: int) -> list[int]:
        """Host PIDs of worker node ``i``'s processes: with its CMDARE_HOME, and their descendants.

        (Descendants too: a process that sets its title, as Ray's agents and workers do, may overwrite
        its /proc/PID/environ.)
        """
        return self._marked_pids(f"CMDARE_HOME={self.node_homes[i]}".encode())

    def _marked_pids(self, mark: bytes) -> list[int]:
        """Processes whose environment holds ``mark`` (``NAME=VALUE``), and their descendants."""
        procs, found = self._ns_procs(), set()
        for pid in procs:
            try:
                if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.add(pid)
            except OSError:
                continue
        while more := {pid for pid, ppid in procs.items() if ppid in found and pid not in found}:
            found |= more
        return sorted(found)

    def kill_worker_node(self, i: int, wait: bool = False, timeout: float = 60.0) -> list[int]:
        """SIGKILL worker node ``i``'s processes and delete its private data dir; returns the PIDs killed.

        ``wait``: also wait until the cluster no longer shows the node (fast with :data:`FAST_NODE_DEATH`).
        """
        killed, deadline = self.node_pids(i), time.time() + 10
        if not killed:
            raise RuntimeError(f"no processes found for worker node {i} ({self.node_homes[i]})")
        _kill(killed)
        while left := self.node_pids(i):  # again until none is left: the raylet may just have forked
            if time.time() > deadline:
                raise RuntimeError(f"node {i} processes survive SIGKILL: {left}")
            _kill(left)
            killed += [p for p in left if p not in killed]
            time.sleep(0.1)
        self.killed.add(i)
        shutil.rmtree(self.node_homes[i], ignore_errors=True)
        if wait:
            self.wait_for_workers(len(self.node_homes) - len(self.killed), timeout)
        return killed

    def close(self) -> None:
        """Kill everything in the namespace (SIGKILL to its PID 1), then wait for ``unshare`` and nsenters."""
        if self.holder_pid:
            _kill([self.holder_pid])
        for proc in [self._unshare, *self._popens] if self._unshare else self._popens:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._unshare is not None and self._unshare.stdout is not None:
            self._unshare.stdout.close()
        self.holder_pid = 0
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def __enter__(self) -> NetnsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
