"""Train the wave forecaster through cmdare's Python API, on this machine's Ray.

Two workers on emulated transient servers (revoked and replaced as they train) and one parameter shard
train half the steps; the run is then resumed from its checkpoint to the end, exported, and the exported
file is loaded by plain PyTorch. Run it from this directory: ``python train_api.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from waves.data import make_sets
from waves.losses import mae, mse
from waves.model import build_net

from cmdare.ps.optimizer_config import OptimizerConfig
from cmdare.storage import as_storage
from cmdare.train import Trainer, TrainSpec
from cmdare.train.callbacks import TrainCallback
from cmdare.train.duties.export import export_run


class ShowEvaluations(TrainCallback):
    """Prints each evaluation of the run's chief: the test loss falling as the forecaster trains."""

    def on_eval(self, report) -> None:
        print(f"  step {report.global_step}: test mse {report.loss:.4f}, mae {report.metrics['mae']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", type=Path, default=None, help="where the run and the exported model go")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="waves-"))

    spec = TrainSpec(model=build_net, dataset=make_sets, loss=mse, metric=mae, workers=2, ps=1,
                     steps=args.steps // 2, batch_size=32, optimizer=OptimizerConfig(lr=0.005, weight_decay=0.0),
                     transient=True, revocations="every=90,step=1", checkpoint_every=100, eval_every=100,
                     storage=str(out / "runs"))
    first = Trainer(spec, [ShowEvaluations()], run_id="waves").run()
    print(f"first part: step {first.global_step}, test mse {first.final_loss:.4f}, "
          f"{first.revocations} revoked, {first.replacements} replaced")

    spec = TrainSpec(**{**vars(spec), "steps": args.steps})  # the same task, trained on to the end
    second = Trainer(spec, [ShowEvaluations()], run_id="waves", resume=True).run()
    print(f"resumed from step {second.details['resumed_from_step']}: step {second.global_step}, "
          f"test mse {second.final_loss:.4f}, mae {second.details['test_metrics']['mae']:.4f}, "
          f"{second.revocations} revoked, {second.replacements} replaced")

    exported = export_run(as_storage(str(out / "runs" / "waves")), out / "waves.pt", spec=spec)
    net = build_net()  # plain PyTorch from here on
    net.load_state_dict(torch.load(exported.path, weights_only=True))
    _, test = make_sets(seed=spec.seed)
    with torch.no_grad():
        test_mse = float(torch.nn.functional.mse_loss(net(test.inputs), test.targets))
    print(f"exported step {exported.step} to {exported.path}; plain PyTorch's test mse {test_mse:.4f}")


if __name__ == "__main__":
    main()
