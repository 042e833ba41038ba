"""Preemption-notice watcher latency against the local metadata server (127.0.0.1, no Ray).

1. Detection delay of a polling watcher: from the server's flip to the notice's ``detected_at``, GCE and
   AWS (IMDSv2), ``--poll`` s between polls. Target: at most 2 poll intervals (a poll in flight at the
   flip may answer "not preempted"; the next one sees it).
2. GCE ``wait_for_change`` long polls: from a flip 0.3 s after the start to ``detected_at``, with a 1 s
   poll interval. Target: under 0.2 s (the waiting request answers at the flip, not at the next poll).
3. ``NoticeWatcher.stop()`` of a watcher retrying an unreachable endpoint. Target: under 1 s.

These were timed asserts in tests/cloud/test_cloud_notices.py; the tests keep the functional checks.

Usage: .venv/bin/python bench/notice_latency.py [--trials 10] [--poll 0.2]
The last line printed is one JSON object with the figures (medians, max, targets, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

from cmdare.cloud.notices import LocalMetadataServer, NoticeWatcher


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def _summary(values: list[float], target_s: float) -> dict[str, float | int | bool]:
    return {"n": len(values), "median_s": round(statistics.median(values), 4), "max_s": round(max(values), 4),
            "min_s": round(min(values), 4), "target_s": target_s, "all_within_target": max(values) <= target_s}


def detection_delays(provider: str, poll_s: float, trials: int) -> list[float]:
    """Flip-to-detection delays of a polling watcher, one fresh server and watcher per trial."""
    out = []
    for _ in range(trials):
        with LocalMetadataServer() as server:
            watcher = NoticeWatcher(server.url_for(provider), provider, poll_interval_s=poll_s)
            with watcher:
                if not _wait_for(lambda w=watcher: w.polls >= 2, 10.0):
                    raise RuntimeError(f"{provider}: the watcher did not poll")
                time.sleep(poll_s * (len(out) % 5) / 5)  # flip at different phases of the poll cycle
                server.preempt()
                if not _wait_for(lambda w=watcher: w.notice is not None, 10.0):
                    raise RuntimeError(f"{provider}: no notice after 10 s")
                out.append(watcher.notice.detected_at - server.preempted_at)
    return out


def long_poll_delays(trials: int) -> list[float]:
    """GCE wait_for_change: flip 0.3 s after the watcher starts (1 s poll interval)."""
    out = []
    for _ in range(trials):
        with LocalMetadataServer() as server:
            watcher = NoticeWatcher(server.gce_url, "gce", poll_interval_s=1.0, wait_for_change=True).start()
            try:
                server.preempt(delay_s=0.3)
                if not _wait_for(lambda w=watcher: w.notice is not None, 10.0):
                    raise RuntimeError("gce long poll: no notice after 10 s")
                out.append(watcher.notice.detected_at - server.preempted_at)
            finally:
                watcher.stop()
    return out


def stop_latencies(trials: int) -> list[float]:
    """stop() of a watcher backing off against a closed port."""
    out = []
    for _ in range(trials):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        url = f"http://127.0.0.1:{port}/computeMetadata/v1/instance/preempted"
        watcher = NoticeWatcher(url, "gce", poll_interval_s=0.05, max_backoff_s=0.2, timeout_s=0.5).start()
        if not _wait_for(lambda w=watcher: w.errors >= 3, 10.0):
            raise RuntimeError("the watcher did not retry the unreachable endpoint")
        t0 = time.monotonic()
        watcher.stop()
        out.append(time.monotonic() - t0)
        if watcher.running:
            raise RuntimeError("stop() returned with the watcher still running")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--poll", type=float, default=0.2, help="poll interval of the polling watchers (s)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were
    out: dict[str, object] = {"bench": "notice_latency", "trials": args.trials, "poll_interval_s": args.poll}
    for provider in ("gce", "aws"):
        out[f"detection_{provider}"] = _summary(detection_delays(provider, args.poll, args.trials), 2 * args.poll)
        print(provider, json.dumps(out[f"detection_{provider}"]), flush=True)
    out["long_poll_gce"] = _summary(long_poll_delays(args.trials), 0.2)
    print("long poll", json.dumps(out["long_poll_gce"]), flush=True)
    out["stop"] = _summary(stop_latencies(args.trials), 1.0)
    print("stop", json.dumps(out["stop"]), flush=True)
    out["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
