"""Run inside the namespace by ``test_allreduce_group.py``: an elastic all-reduce group of 3 members, one per worker
node of a ``ray start`` cluster, that loses the member of a killed node and heals a newcomer on a new node.

Usage: python allreduce_group_driver.py ADDRESS CONTROL_DIR. Writes CONTROL_DIR/phase1 once the group of 3 trains
(the test then kills a worker node), trains on until the loss ends a chunk, re-forms the survivors, writes
CONTROL_DIR/phase2 (the test adds a node), waits for it, heals a newcomer placed there, trains, and prints one
JSON line with what happened.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import ray

from cmdare.collective import Rendezvous
from cmdare.train import TrainSpec
from cmdare.train.allreduce.replica import Replica


def main() -> None:
    address, control = sys.argv[1], Path(sys.argv[2])
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    spec = TrainSpec(model="resnet8", dataset="digits", workers=3, steps=10**6, batch_size=16, seed=1)
    rendezvous = Rendezvous("127.0.0.1")
    actor = ray.remote(num_cpus=1, resources={"cmdare_worker": 1}, max_restarts=0)(Replica)

    def start() -> object:
        return actor.remote(spec, rendezvous.address, threads=1, deadline_s=5.0)

    def form(members: list, epoch: int, root: int) -> None:
        assert all(ray.get([m.form.remote(epoch, r, len(members)) for r, m in enumerate(members)], timeout=120))
        assert all(ray.get([m.heal.remote(root) for m in members], timeout=120))

    members = [start() for _ in range(3)]
    nodes = ray.get([m.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for m in members])
    form(members, 1, 0)
    first = ray.get([m.run_steps.remote(3) for m in members], timeout=120)
    (control / "phase1").write_text(json.dumps(nodes))
    # the step before the loss: the kill may come during the very next chunk, so it starts where this one ended
    t_loss, survivors, steps_before = None, [], first[0].step
    for _ in range(600):  # chunks until the killed node's member is lost
        refs = [m.run_steps.remote(2) for m in members]
        results = []
        for m, ref in zip(members, refs, strict=True):
            try:
                results.append((m, ray.get(ref, timeout=60)))
            except ray.exceptions.RayError:
                t_loss = t_loss or time.monotonic()
        if t_loss is None and not any(r.lost for _, r in results):
            steps_before = results[0][1].step
            continue
        t_loss = t_loss or time.monotonic()
        survivors = [(m, r) for m, r in results]
        break
    assert len(survivors) == 2, f"{len(survivors)} members answered after the node was killed"
    root = max(range(2), key=lambda i: survivors[i][1].step)
    members = [m for m, _ in survivors]
    form(members, 2, root)
    after = ray.get([m.run_steps.remote(3) for m in members], timeout=120)
    recovered_s = time.monotonic() - t_loss
    (control / "phase2").write_text("re-formed")
    deadline = time.monotonic() + 180
    while ray.available_resources().get("cmdare_worker", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    newcomer = start()
    ray.get(newcomer.ping.remote(), timeout=180)
    members.append(newcomer)
    form(members, 3, 0)
    final = ray.get([m.run_steps.remote(3) for m in members], timeout=120)
    params = ray.get([m.params.remote() for m in members])
    node_of_newcomer = ray.get(newcomer.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
    print(json.dumps({
        "steps_before_loss": int(steps_before), "steps_after_regroup": [int(r.step) for r in after],
        "final_steps": [int(r.step) for r in final], "lost": [r.lost for r in final],
        "replicas_equal": all(np.array_equal(p, params[0]) for p in params[1:]),
        "recovered_s": round(recovered_s, 3), "newcomer_on_new_node": node_of_newcomer not in nodes,
    }))
    rendezvous.close()


if __name__ == "__main__":
    main()
