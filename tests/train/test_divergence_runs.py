"""Divergence on real Ray workers (issue 42): at lr 5 the zoo's loss grew to 2.9e14 while its parameters went
non-finite, no rollback happened and the run ended on '3 checkpoint uploads in a row failed'. Now the exploding
loss (or the non-finite parameters) is divergence: the shards roll back, and nothing non-finite reaches storage."""

from __future__ import annotations

from cmdare.errors import TransientError
from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback


class _Events(TrainCallback):
    def __init__(self):
        self.events = []

    def on_event(self, r):
        self.events.append(r)

    def kinds(self, kind):
        return [e for e in self.events if e.kind == kind]


def test_an_exploding_finite_loss_rolls_back_and_stores_nothing_broken(local_ray, tmp_path):
    spec = TrainSpec(model="resnet8", dataset="digits", workers=2, ps=1, steps=200, batch_size=32, seed=1,
                     optimizer=OptimizerConfig(lr=5.0), async_momentum="keep", checkpoint_every=40, eval_every=0,
                     on_diverge="rollback:1", chunk_steps=5)
    log = _Events()
    try:
        summary = Trainer(spec, [log], checkpoint_dir=tmp_path).run()
        ended = f"finished at step {summary.global_step}"
    except TransientError as err:
        ended = str(err)
        assert ended.startswith("training diverged again after 1 rollback(s): worker "), ended
    restored = [e for e in log.kinds("shard_restored") if e.details.get("reason") == "diverged"]
    assert len(restored) == 1, ended
    assert not log.kinds("checkpoint_failed"), [e.details for e in log.kinds("checkpoint_failed")]
