"""The probe of a silent run, on real Ray actors: who answers, who died, who hangs; and the cluster itself."""

from __future__ import annotations

import threading

from cmdare.train.runtime.cluster_health import cluster_lost, probe_actors


def test_probe_tells_answering_dead_and_hanging_actors_apart(local_ray):
    ray = local_ray

    class _Pinged:  # defined here: Ray ships it by value (the test module is not importable in a worker)
        def __init__(self, hang: bool = False):
            self.hang = hang
            self.release = threading.Event()

        def ping(self) -> int:
            if self.hang:
                self.release.wait(60)
            return 1

    actor = ray.remote(_Pinged).options(num_cpus=0, max_concurrency=2)
    alive, dead, hung = actor.remote(), actor.remote(), actor.remote(hang=True)
    ray.get([alive.ping.remote(), dead.ping.remote()])
    ray.kill(dead, no_restart=True)
    failed, pending = probe_actors({"alive": alive, "dead": dead, "hung": hung}, timeout_s=2.0)
    assert failed == {"dead": "ActorDiedError", "hung": "unresponsive"}
    assert len(pending) == 1  # the hung ping, left for the caller to end
    assert probe_actors({}, timeout_s=1.0) == ({}, [])
    ray.kill(hung, no_restart=True)


def test_a_live_cluster_is_not_lost(local_ray):
    assert cluster_lost() is None
