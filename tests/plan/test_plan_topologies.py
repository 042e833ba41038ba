"""``cmdare plan`` prices every candidate cluster through a PS and with all-reduce, and says which it chose and why:
all-reduce for a large model whose PS link chokes, a PS for a small model on mixed GPUs (every all-reduce step waits
for the K80s)."""

from __future__ import annotations

import json

import pytest

from cli_inprocess import one_error, run_cmdare
from cmdare.plan.adapters import load_plan_models
from cmdare.plan.recommender import enumerate_clusters, job_for, recommend
from cmdare.plan.spec import JobSpec

RESNET50 = ["plan", "--model", "resnet50", "--input-shape", "3,224,224", "--gpus", "v100", "--max-workers", "4",
            "--no-mixes", "--steps", "20000", "--deadline", "40min", "--runs", "3", "--json"]


def test_every_cluster_of_two_workers_or_more_is_priced_in_both_topologies():
    both = enumerate_clusters(["v100"], ["us-east1"], 3, 2, mixes=False, topologies=("ps", "allreduce"))
    ring = [c for c in both if c.topology == "allreduce"]
    assert sorted((c.n_workers, c.workers[0].transient) for c in ring) == [(2, False), (2, True), (3, False),
                                                                          (3, True)]
    assert all(c.ps == 0 for c in ring)
    only_ps = enumerate_clusters(["v100"], ["us-east1"], 3, 2, mixes=False)
    assert len(both) == len(only_ps) + len(ring) and all(c.topology == "ps" for c in only_ps)
    # single-server training stays in either case; with all-reduce alone no cluster trains through a PS
    alone = enumerate_clusters(["v100"], ["us-east1"], 3, 2, mixes=False, topologies=("allreduce",))
    assert {(c.topology, c.ps) for c in alone} == {("ps", 0), ("allreduce", 0)}


def test_an_all_reduce_group_trains_the_same_batches_in_fewer_group_steps():
    job = JobSpec("t2t_resnet15", 64_000, 1000)
    (ring,) = [c for c in enumerate_clusters(["v100"], ["us-east1"], 3, 1, mixes=False, topologies=("allreduce",))
               if c.n_workers == 3 and not c.any_transient]
    assert (job_for(job, ring).total_steps, job_for(job, ring).checkpoint_every_steps) == (21_334, 333)
    sync = JobSpec("t2t_resnet15", 64_000, 1000, sync=True)  # rounds of every worker's batch: the same steps
    assert job_for(sync, ring) == sync


def test_a_small_model_on_mixed_gpus_trains_through_a_ps():
    """Res15 on 2 K80s and 2 V100s (the 2019 prices): the search prices the same workers through 1 and 2 PS and
    with all-reduce; the PS wins (its asynchronous workers add their speeds), and the reason says by how much."""
    models = load_plan_models("t2t_resnet15", catalog="icac2019")
    clusters = [c for c in enumerate_clusters(["k80", "v100"], ["us-east1"], 4, 2, topologies=("ps", "allreduce"))
                if c.gpu_counts == {"k80": 2, "v100": 2} and not c.any_transient]
    assert sorted(c.topology for c in clusters) == ["allreduce", "ps", "ps"]
    rec = recommend(JobSpec("t2t_resnet15", 200_000), clusters, models, runs=1)
    assert rec.choice is not None and rec.choice.cluster.topology == "ps"
    ring = next(o for o in rec.options if o.cluster.topology == "allreduce")
    assert ring.summary.time_mean_s > 1.5 * rec.choice.summary.time_mean_s
    assert any(r.startswith("a PS over all-reduce on these workers:") for r in rec.reasons), rec.reasons


def test_plan_chooses_all_reduce_for_a_large_model_whose_ps_link_chokes(tmp_path):
    code, out, err = run_cmdare(tmp_path, *RESNET50)
    assert code == 0, err
    data = json.loads(out)
    choice = data["choice"]
    assert "all-reduce" in choice["config"] and "--topology allreduce" in choice["train_command"]
    topology = data["topology"]
    assert topology["recommended"] == "allreduce" and topology["faster"] == "allreduce"
    assert topology["allreduce_batches_per_s"] > 1.5 * topology["ps_batches_per_s"]
    assert any(n.startswith("topology: all-reduce chosen;") for n in data["notes"])
    # priced through a PS only, the same plan chooses a PS run and says all-reduce was not priced
    code, out, err = run_cmdare(tmp_path, *RESNET50, "--topologies", "ps")
    assert code == 0, err
    data = json.loads(out)
    assert "all-reduce" not in json.dumps(data["front"]) and data["topology"]["recommended"] == "ps"
    assert any("(all-reduce was not priced: --topologies)" in n for n in data["notes"])


def test_all_reduce_options_are_predicted_an_accuracy_and_the_note_says_how(tmp_path):
    """With the published accuracy model, an all-reduce option is predicted as synchronous training of the same
    samples: more accurate than the asynchronous PS run of its workers; --min-accuracy weighs both topologies."""
    code, out, err = run_cmdare(tmp_path, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--max-workers", "4",
                                "--runs", "3", "--min-accuracy", "0.5", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["choice"] is not None
    front = {o["config"]: o for o in data["front"]}
    allreduce = [o for c, o in front.items() if "all-reduce" in c]
    assert allreduce and all(o["accuracy_mean"] > 0.5 for o in allreduce), list(front)
    # the same 4 T4s: synchronous all-reduce is predicted above the asynchronous PS run (no stale gradients)
    ps, ar = front["4xT4 spot + 2 PS @us-east1"], front["4xT4 spot + all-reduce @us-east1"]
    assert ar["accuracy_mean"] > ps["accuracy_mean"]
    assert any(n.startswith("all-reduce accuracy: predicted as synchronous training") for n in data["notes"])


@pytest.mark.parametrize(("value", "says"), [("mesh", "unknown --topology 'mesh'"), (",", "--topologies needs")])
def test_bad_topologies_are_one_line(tmp_path, value, says):
    res = run_cmdare(tmp_path, "plan", "--model", "t2t_resnet32", "--steps", "64000", "--topologies", value)
    assert one_error(res, says), res
