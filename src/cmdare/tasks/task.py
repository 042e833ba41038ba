"""What a run trains: a :class:`Task` (model, training and test data, loss, metric), from either provider.

* **Built in**: a zoo model (or a model factory) on a built-in dataset (``digits``, ``synthetic``,
  ``cifar10``): the images fitted to the model, cross-entropy, test accuracy.
* **Yours**: a dataset given as an object or an import path (a map-style ``torch.utils.data.Dataset``, a
  ``DataLoader`` whose dataset and collate function are used, or a factory of either, which may return a
  ``(train, test)`` pair), any model factory, any loss (default cross-entropy) and optional metrics.

Both give the same interface, and the engine uses only it: a worker's batches come from
:meth:`Task.stream` (the deterministic sharding of :class:`~cmdare.datasets.BatchStream`, for any map-style
dataset too), its loss from :meth:`Task.loss_of`, the chief's evaluation from :meth:`Task.evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cmdare.datasets import BatchStream, MapSamples, list_datasets, load_dataset
from cmdare.datasets.sharding import take_batch
from cmdare.errors import UnknownNameError, UserInputError
from cmdare.tasks.parts import loss_function, metric_function, part_name, resolve_part
from cmdare.workloads.import_path import call_with, is_import_path

if TYPE_CHECKING:
    import torch

__all__ = ["EVAL_BATCH", "Evaluation", "Task", "build_task", "is_builtin_dataset"]

EVAL_BATCH = 512  # test samples per forward pass of an evaluation


@dataclass(frozen=True)
class Evaluation:
    """A model's mean test loss and metrics (``accuracy`` for the built-in datasets) over ``samples`` test
    samples (0: the task has no test data, and the loss is nan)."""

    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    @property
    def accuracy(self) -> float | None:
        """The test accuracy, where the task measures one."""
        return self.metrics.get("accuracy")


@dataclass
class Task:
    """A run's model, data, loss and metric, as every worker and the driver use them."""

    model_name: str
    build: Callable[[], torch.nn.Module]  # a fresh model (drawn from torch's global RNG)
    train: tuple[Any, Any] | MapSamples
    test: tuple[Any, Any] | MapSamples | None
    loss: Callable[[Any, Any], Any]
    metric: Callable[[Any, Any], Any] | None
    loss_label: str = "the loss"

    def stream(self, slot: int, num_slots: int, batch_size: int, seed: int, start_batch: int = 0) -> BatchStream:
        """Data slot ``slot``'s batches (a pure function of the arguments: a resume continues the same order)."""
        return BatchStream(self.train, slot, num_slots, batch_size, seed, start_batch=start_batch)

    def recompute_statistics(self, model: torch.nn.Module, device: Any, batch_size: int, seed: int,
                             samples: int) -> int:
        """Recompute ``model``'s batch-norm statistics for its parameters from ``samples`` training samples in
        a fixed order drawn from ``seed`` (:mod:`cmdare.tasks.statistics`); returns the layers recomputed."""
        from cmdare.tasks.statistics import CALIBRATION_SEED, calibration_batches, recompute_batch_norm

        count = calibration_batches(_length(self.train), batch_size, samples)
        batches = BatchStream(self.train, 0, 1, batch_size, seed + CALIBRATION_SEED)
        return recompute_batch_norm(model, batches, count, device, seed)

    def loss_of(self, output: Any, target: Any) -> torch.Tensor:
        """The batch's loss, refused unless it is a scalar tensor.

        Raises:
            UserInputError: the loss returned something else.
        """
        import torch

        loss = self.loss(output, target)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise UserInputError(f"{self.loss_label} returned {what}, not a scalar: reduce it (e.g. .mean())")
        return loss.reshape(())

    def evaluate(self, model: torch.nn.Module, device: Any, max_samples: int | None = None) -> Evaluation:
        """``model``'s mean loss and metrics over the test data (its first ``max_samples``), batch by batch."""
        import torch

        if self.test is None:
            return Evaluation(float("nan"))
        n = _length(self.test)
        n = min(n, max_samples) if max_samples else n
        totals: dict[str, float] = {}
        loss_sum = 0.0
        with torch.no_grad():
            for lo in range(0, n, EVAL_BATCH):
                x, y = take_batch(self.test, torch.arange(lo, min(n, lo + EVAL_BATCH)))
                x, y = _to(x, device), _to(y, device)
                out, size = model(x), min(n, lo + EVAL_BATCH) - lo
                loss_sum += float(self.loss_of(out, y)) * size
                for name, value in _metrics(self.metric, out, y).items():
                    totals[name] = totals.get(name, 0.0) + value * size
        return Evaluation(loss_sum / max(n, 1), {k: v / max(n, 1) for k, v in totals.items()}, n)

    def check(self, batch_size: int, num_slots: int, seed: int) -> None:
        """Build the model and run one batch through it, the loss and the metric on this process, so that a
        mistake in the user's code is one line here rather than a failing worker later.

        Raises:
            UserInputError: a slot gets no whole batch, the model's parameters are not float32, the forward
                pass, the loss or the metric fails, or the loss is not a scalar.
        """
        import torch
        import torch.nn.functional as F

        x, y = next(self.stream(0, num_slots, batch_size, seed))
        if self.loss is F.cross_entropy and isinstance(y, torch.Tensor) and y.is_floating_point():
            raise UserInputError("the dataset's targets are floating-point numbers and the default loss, "
                                 "cross-entropy, wants class labels: pass your loss (e.g. --loss "
                                 "torch.nn.functional:mse_loss)")
        model = self.build()
        odd = [(n, p.dtype) for n, p in model.named_parameters() if p.dtype != torch.float32]
        if odd:
            name, dtype = odd[0]
            raise UserInputError(f"--model {self.model_name}: parameter {name} is {str(dtype).removeprefix('torch.')}; "
                                 "the parameter shards hold float32 only: build the model in float32 (model.float())")
        try:
            with torch.no_grad():
                out = model(x)
        except Exception as err:  # noqa: BLE001 - the user's forward pass failed on the user's data: one line
            raise UserInputError(f"--model {self.model_name}: the forward pass failed on a batch of the dataset "
                                 f"({type(err).__name__}: {_first_line(err)})") from None
        try:
            self.loss_of(out, y)
            _metrics(self.metric, out, y)
        except UserInputError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's loss or metric failed: one line
            raise UserInputError(f"{self.loss_label} or the metric failed on a batch ({type(err).__name__}: "
                                 f"{_first_line(err)})") from None


def is_builtin_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` names a registered dataset (``digits``, ``synthetic``, ``cifar10``, ...)."""
    return isinstance(dataset, str) and not is_import_path(dataset) and dataset in list_datasets()


def build_task(model: Any, dataset: Any, *, loss: Any = None, metric: Any = None, data_dir: str | None = None,
               image_size: int | None = None, channels: int | None = None, seed: int = 0) -> Task:
    """The task of a run: ``model`` (a zoo name, an import path or a factory) on ``dataset`` (a registered name,
    an import path or an object), trained with ``loss`` (default cross-entropy) and evaluated with ``metric``
    (default: accuracy on a built-in dataset, none on yours).

    Raises:
        UnknownNameError: an unknown dataset name.
        UserInputError: a part that does not import, a factory that raises, an empty dataset, or a dataset
            that is not map-style.
    """
    from cmdare.workloads import build_model

    loss_fn = loss_function(loss)
    loss_label = f"--loss {part_name(loss)}" if loss is not None else "the loss (cross-entropy)"
    metric_fn = metric_function(metric)
    name = part_name(model)
    if is_builtin_dataset(dataset):
        data = load_dataset(dataset, data_dir, image_size=image_size, channels=channels, seed=seed)
        classes, in_channels = data.num_classes, data.input_shape[0]
        return Task(name, lambda: _model(model, name, classes, in_channels), (data.train_x, data.train_y),
                    (data.test_x, data.test_y), loss_fn, metric_fn if metric is not None else _accuracy, loss_label)
    if isinstance(dataset, str) and not is_import_path(dataset):
        raise UnknownNameError("dataset", dataset, list_datasets())
    train, test = _user_data(dataset, data_dir, seed)
    if isinstance(model, str) and not is_import_path(model):  # a zoo network on your data: it needs the classes
        classes = getattr(train.dataset, "num_classes", None)
        if not isinstance(classes, int):
            raise UserInputError(f"--model {model} is an image classifier: give your dataset a num_classes attribute, "
                                 "or pass your own model factory")
        import torch

        x, _ = train.batch(torch.arange(1))
        return Task(name, lambda: build_model(model, classes, int(x.shape[1])), train, test, loss_fn, metric_fn,
                    loss_label)
    return Task(name, lambda: _model(model, name, None, None), train, test, loss_fn, metric_fn, loss_label)


def _model(model: Any, name: str, classes: int | None, in_channels: int | None) -> torch.nn.Module:
    """A fresh model from a zoo name, an import path or a factory (given the classes and channels it takes)."""
    import torch

    from cmdare.workloads import build_model

    if isinstance(model, str):
        if classes is None or in_channels is None:
            return _checked_module(call_with(resolve_part(model, "--model"), f"--model {name}"), name)
        return build_model(model, classes, in_channels)
    given = {} if classes is None else {"num_classes": classes, "in_channels": in_channels}
    built = model if isinstance(model, torch.nn.Module) else call_with(model, f"--model {name}", **given)
    return _checked_module(built, name)


def _checked_module(built: Any, name: str) -> torch.nn.Module:
    import torch

    if not isinstance(built, torch.nn.Module):
        raise UserInputError(f"--model {name}: the factory returned {type(built).__name__}, not a torch.nn.Module")
    return built


def _user_data(dataset: Any, data_dir: str | None, seed: int) -> tuple[MapSamples, MapSamples | None]:
    """Your training (and test) data as map-style samples."""
    label = f"--dataset {part_name(dataset)}"
    obj = resolve_part(dataset, "--dataset")
    if callable(obj) and (isinstance(obj, type) or not (_map_style(obj) or _is_loader(obj))):  # a factory, a class
        obj = call_with(obj, label, seed=seed, data_dir=data_dir)
    train, test = obj if isinstance(obj, tuple | list) and len(obj) == 2 else (obj, None)
    return _samples(train, label, "training"), (None if test is None else _samples(test, label, "test"))


def _samples(obj: Any, label: str, split: str) -> MapSamples:
    collate = None
    if _is_loader(obj):  # its dataset and collate function; cmdare's sharding replaces its sampler
        obj, collate = obj.dataset, obj.collate_fn
    if not _map_style(obj):
        raise UserInputError(f"{label}: the {split} data is a {type(obj).__name__}, not a map-style dataset "
                             "(a torch.utils.data.Dataset with __len__ and __getitem__)")
    if len(obj) == 0:
        raise UserInputError(f"{label}: the {split} dataset is empty (length 0)")
    return MapSamples(obj, collate, label)


def _map_style(obj: Any) -> bool:
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__") and not isinstance(obj, str | bytes | dict)


def _is_loader(obj: Any) -> bool:
    from torch.utils.data import DataLoader

    return isinstance(obj, DataLoader)


def _length(data: tuple[Any, Any] | MapSamples) -> int:
    return len(data[0]) if isinstance(data, tuple) else len(data)


def _to(value: Any, device: Any) -> Any:
    return value.to(device, non_blocking=True) if hasattr(value, "to") else value


def _accuracy(out: Any, target: Any) -> dict[str, float]:
    return {"accuracy": float((out.argmax(1) == target).float().mean())}


def _metrics(metric: Callable[[Any, Any], Any] | None, out: Any, target: Any) -> dict[str, float]:
    """``metric``'s batch means as ``{name: value}`` (a single value is named ``metric``)."""
    if metric is None:
        return {}
    value = metric(out, target)
    items = value.items() if isinstance(value, dict) else [(getattr(metric, "__name__", "metric"), value)]
    try:
        return {str(k): float(v) for k, v in items}
    except (TypeError, ValueError):
        raise UserInputError(f"the metric returned {type(value).__name__}: return a number or a dict of numbers "
                             "(the batch mean)") from None


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else ""
