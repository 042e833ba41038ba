"""Training on Ray: the spec, the coordinator, workers, checkpoints and measurement hooks.

Python API::

    from cmdare.train import TrainSpec, train
    summary = train(TrainSpec(model="resnet15", dataset="digits", workers=2, ps=1, steps=500))
"""

from cmdare.ps.optimizer import OptimizerConfig
from cmdare.train.callbacks import TrainCallback
from cmdare.train.spec import TrainSpec
from cmdare.train.trainer import Trainer, train

__all__ = ["OptimizerConfig", "TrainCallback", "TrainSpec", "Trainer", "train"]
