"""Mixed GPU types in one run (``--workers k80:2,v100:1``): each worker on a server of its type and price.

Locally the types are emulated: each worker's steps are stretched to the step-time model's ratio between
its type and the fastest type present, so per-worker speeds follow the model. On a cluster, each worker is
placed on a node of its type by the resources ``cmdare cluster-config`` gives each worker node type.
"""

from __future__ import annotations

import pytest

from cmdare.cloud.launcher import gpu_resource
from cmdare.cloud.ray_cluster import RayClusterProvider
from cmdare.measure.recorder import StoreRecorder
from cmdare.measure.reports.run import build as run_report
from cmdare.measure.store import open_store
from cmdare.train import Trainer, TrainSpec
from cmdare.train.run.gpu_speeds import step_time_s

pytestmark = pytest.mark.cluster  # make test-cluster: multi-node clusters of mixed GPU types

MIX = "k80:2,v100:1"


def _spec(**kw) -> TrainSpec:
    workers, mix = TrainSpec.parse_workers(MIX)
    return TrainSpec(**{"model": "resnet8", "workers": workers, "worker_gpus": mix, "steps": 360, "chunk_steps": 5,
                        "checkpoint_every": 0, "eval_every": 0, "transient": True, "revocations": "none",
                        "startup": "0", **kw})


def test_a_local_mixed_run_trains_each_type_at_the_step_time_models_speed(tmp_path):
    assert TrainSpec.parse_workers("3") == (3, None) and TrainSpec.parse_workers(MIX) == (3, MIX)
    # 1,200 steps (2-4 s of training here): the speeds settle after the first chunks, which run before the
    # fastest type's step time is known (360 steps gave ratios 1.13-1.21 of the model's, at the 15% edge)
    spec = _spec(steps=1200)
    assert spec.slot_gpus() == ["k80", "k80", "v100"]
    url = f"sqlite:///{tmp_path / 'store.db'}"
    summary = Trainer(spec, [StoreRecorder(url)], checkpoint_dir=tmp_path / "ckpt").run()
    assert summary.status == "finished" and summary.global_step >= 1200

    servers = open_store(url).frame("servers", where=lambda c: c.run_id == summary.run_id)
    assert len(servers) == 4 and set(servers.end_reason) == {"released"}  # recorded before the run's end
    assert servers.ended_at.notna().all()
    workers = run_report(open_store(url), summary.run_id).tables["workers"]
    assert sorted(workers.gpu_type) == ["K80", "K80", "V100"]
    prices = dict(zip(workers.gpu_type, workers.price_per_hour_usd, strict=True))
    assert prices["V100"] > prices["K80"] > 0  # each server priced as its type
    assert workers.emulated.astype(bool).all() and workers.staleness_mean.notna().all()
    speed = workers.groupby("gpu_type").steps_per_s.mean()
    expected = step_time_s("resnet8", "k80") / step_time_s("resnet8", "v100")
    assert expected > 2  # the model tells the types apart for this CNN
    assert speed["V100"] / speed["K80"] == pytest.approx(expected, rel=0.15)


def test_on_a_cluster_each_worker_lands_on_a_node_of_its_type(cluster, tmp_path):
    import ray

    nodes = {gpu: [cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1",
                                    resources={"cmdare_worker": 1, gpu_resource(gpu): 1}) for _ in range(n)]
             for gpu, n in (("k80", 2), ("v100", 1))}
    try:
        cluster.wait_for_nodes()
        provider = RayClusterProvider()
        summary = Trainer(_spec(steps=60), checkpoint_dir=tmp_path / "ckpt", provider=provider).run()
        assert summary.status == "finished"
        type_of_node = {n.node_id: gpu for gpu, group in nodes.items() for n in group}
        actors = ray._private.state.actors()
        placed = sorted((s.spec.gpu_type, type_of_node.get(actors[s.actor._actor_id.hex()]["Address"]["NodeID"]))
                        for s in provider.servers if s.spec.role == "worker")
        assert placed == [("K80", "k80"), ("K80", "k80"), ("V100", "v100")]
        assert not any(s.emulated for s in provider.servers)  # a real cluster's servers: nothing emulated
    finally:
        for group in nodes.values():
            for n in group:
                cluster.remove_node(n)
