"""What a run trains: a :class:`Task` (model, training and test data, loss, metric), from either provider.

* **Built in**: a zoo model (or a model factory) on a built-in dataset (``digits``, ``synthetic``,
  ``cifar10``): the images fitted to the model, cross-entropy, test accuracy.
* **Yours**: a dataset given as an object or an import path (a map-style ``torch.utils.data.Dataset``, a
  ``DataLoader`` whose dataset and collate function are used, or a factory of either, which may return a
  ``(train, test)`` pair), any model factory, any loss (default cross-entropy) and optional metrics.

Both give the same interface, and the engine uses only it: a worker's batches come from
:meth:`Task.stream` (the deterministic sharding of :class:`~cmdare.datasets.BatchStream`, for any map-style
dataset too), each training step's loss from :meth:`Task.step_loss` and its gradient from :meth:`Task.backward`,
the chief's evaluation from :meth:`Task.evaluate`. Each calls the user's code so that whatever it raises (or a
``sys.exit``) is one :class:`~cmdare.errors.UserInputError` naming the part (``--model``, ``--dataset``,
``--loss``, ``--metric``) and the step; :meth:`Task.check` runs one whole step on the driver before anything
starts, each call bounded in time (:mod:`cmdare.workloads.user_code`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cmdare.datasets import BatchStream, MapSamples, list_datasets, load_dataset
from cmdare.datasets.sharding import BatchError, take_batch
from cmdare.errors import UnknownNameError, UserInputError
from cmdare.tasks.parts import loss_function, metric_function, part_name, resolve_part
from cmdare.workloads.import_path import call_with, is_import_path
from cmdare.workloads.user_code import describe, run_bounded

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
    metric_label: str = "the metric"

    @property
    def model_label(self) -> str:
        """``--model NAME``: how errors name the model."""
        return f"--model {self.model_name}"

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

    def loss_of(self, output: Any, target: Any, at: str = "") -> torch.Tensor:
        """The batch's loss, refused unless it is a floating-point scalar tensor (``at``: `` at step N``).

        Raises:
            UserInputError: the loss returned something else.
        """
        import torch

        loss = self.loss(output, target)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise UserInputError(f"{self.loss_label}{at} returned {what}, not a scalar: reduce it (e.g. .mean())")
        if not loss.is_floating_point():
            raise UserInputError(f"{self.loss_label}{at} returned a scalar of dtype "
                                 f"{str(loss.dtype).removeprefix('torch.')}, an integer tensor: a loss to train on is "
                                 "a floating-point tensor computed from the model's output (it has a gradient)")
        return loss.reshape(())

    def step_loss(self, model: torch.nn.Module, stream: BatchStream, device: Any, step: int) -> torch.Tensor:
        """One training step's loss: the next batch of ``stream`` moved to ``device``, the forward pass, the loss.

        Raises:
            UserInputError: the data, the model or the loss failed (one line naming it and ``step``).
        """
        at = f" at step {step}"
        x, y = self._batch(stream, at)
        x, y = _to(x, device), _to(y, device)
        out = self._call(lambda: model(x), f"{self.model_label}{at}: the forward pass failed on a batch of the "
                                            "dataset")
        return self._call(lambda: self.loss_of(out, y, at), f"{self.loss_label}{at} failed")

    def backward(self, model: torch.nn.Module, loss: torch.Tensor, step: int | None = None) -> None:
        """``loss.backward()``; a loss with no gradient is said in words (a model whose parameters are all frozen,
        or a loss that does not depend on the output).

        Raises:
            UserInputError: no gradient, or the backward pass failed (one line naming the part and ``step``).
        """
        at = "" if step is None else f" at step {step}"
        if not loss.requires_grad:
            if not any(p.requires_grad for p in model.parameters()):
                raise UserInputError(f"{self.model_label}{at}: none of its parameters requires a gradient "
                                     "(requires_grad=False): there is nothing to train")
            raise UserInputError(f"{self.loss_label}{at} returned a loss with no gradient: it does not depend on the "
                                 "model's output (compute it from the output with torch operations)")
        self._call(loss.backward, f"{self.model_label}{at}: the backward pass failed")

    def time_step(self, model: torch.nn.Module, batch_size: int, seed: int, repeats: int = 3) -> float:
        """Seconds one training step of ``model`` takes on this process (forward, loss, backward on a batch of
        ``batch_size``; the median of ``repeats`` after one to warm up), torch's random state left as it was."""
        import time

        import torch

        stream = self.stream(0, 1, batch_size, seed)
        times = []
        with torch.random.fork_rng(devices=[]):
            model.train()
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                self.backward(model, self.step_loss(model, stream, "cpu", 0))
                times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        return sorted(times[1:])[len(times[1:]) // 2]

    def evaluate(self, model: torch.nn.Module, device: Any, max_samples: int | None = None) -> Evaluation:
        """``model``'s mean loss and metrics over the test data (its first ``max_samples``), batch by batch.

        Raises:
            UserInputError: the test data, the model, the loss or the metric failed (one line naming it).
        """
        import torch

        if self.test is None:
            return Evaluation(float("nan"))
        n = _length(self.test)
        n = min(n, max_samples) if max_samples else n
        totals: dict[str, float] = {}
        loss_sum = 0.0
        at = " on the test data"
        with torch.no_grad():
            for lo in range(0, n, EVAL_BATCH):
                idx = torch.arange(lo, min(n, lo + EVAL_BATCH))
                x, y = self._call(lambda i=idx: take_batch(self.test, i), f"{_data_label(self.test)}: a batch failed")
                x, y = _to(x, device), _to(y, device)
                out = self._call(lambda x=x: model(x), f"{self.model_label}{at}: the forward pass failed")
                loss = self._call(lambda o=out, t=y: self.loss_of(o, t, at), f"{self.loss_label}{at} failed")
                loss_sum += float(loss) * len(idx)
                for name, value in self._call(lambda o=out, t=y: _metrics(self.metric, o, t),
                                              f"{self.metric_label}{at} failed").items():
                    totals[name] = totals.get(name, 0.0) + value * len(idx)
        return Evaluation(loss_sum / max(n, 1), {k: v / max(n, 1) for k, v in totals.items()}, n)

    def check(self, batch_size: int, num_slots: int, seed: int) -> None:
        """Build the model and run one training step's batch through it, the loss, the backward pass and the
        metric, then the evaluation of the first test samples, on this process, each call bounded in time, so that
        a mistake in the user's code is one line here rather than a failing worker later.

        Raises:
            UserInputError: a slot gets no whole batch, the model's parameters are not float32, the data, the
                forward pass, the loss, the backward pass or the metric fails (or does not return in time), or
                the loss is not a floating-point scalar with a gradient.
        """
        import torch
        import torch.nn.functional as F

        stream = self.stream(0, num_slots, batch_size, seed)
        data = _data_label(self.train)
        x, y = run_bounded(lambda: self._call(lambda: next(stream), f"{data}: its first batch failed", interrupt=True),
                           f"{data}: its first batch")
        if self.loss is F.cross_entropy and isinstance(y, torch.Tensor) and y.is_floating_point():
            raise UserInputError("the dataset's targets are floating-point numbers and the default loss, "
                                 "cross-entropy, wants class labels: pass your loss (e.g. --loss "
                                 "torch.nn.functional:mse_loss)")
        model = self.build()
        odd = [(n, p.dtype) for n, p in model.named_parameters() if p.dtype != torch.float32]
        if odd:
            name, dtype = odd[0]
            raise UserInputError(f"{self.model_label}: parameter {name} is {str(dtype).removeprefix('torch.')}; "
                                 "the parameter shards hold float32 only: build the model in float32 (model.float())")
        out = run_bounded(lambda: self._call(lambda: model(x), f"{self.model_label}: the forward pass failed on a "
                                             "batch of the dataset", interrupt=True),
                          f"{self.model_label}: the forward pass on a batch of the dataset")
        loss = run_bounded(lambda: self._call(lambda: self.loss_of(out, y), f"{self.loss_label} failed on a batch",
                                              interrupt=True), self.loss_label)
        run_bounded(lambda: self._call(lambda: self.backward(model, loss), "the backward pass failed", interrupt=True),
                    f"{self.model_label}: the backward pass")
        detached = out.detach() if isinstance(out, torch.Tensor) else out
        run_bounded(lambda: self._call(lambda: _metrics(self.metric, detached, y), f"{self.metric_label} failed on a "
                                       "batch", interrupt=True), self.metric_label)
        if self.test is not None:  # the chief's evaluation, on the first test samples
            model.eval()
            run_bounded(lambda: self._call(lambda: self.evaluate(model, "cpu", max_samples=batch_size),
                                           f"{self.model_label}: the evaluation failed", interrupt=True),
                        f"{self.model_label}: the evaluation on the test data")

    def _batch(self, stream: BatchStream, at: str) -> tuple[Any, Any]:
        """``next(stream)``; a failure of the user's data names the dataset and where."""
        try:
            return next(stream)
        except BatchError as err:
            raise UserInputError(f"{err.label}{at}: {err.detail}") from None
        except UserInputError:
            raise
        except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's data: one line
            raise UserInputError(f"{_data_label(stream.samples)}{at}: batch {stream.position - 1} failed "
                                 f"({describe(err)})") from None

    @staticmethod
    def _call(fn: Callable[[], Any], failed: str, interrupt: bool = False) -> Any:
        """``fn()``; what the user's code raises (``SystemExit`` too; ``KeyboardInterrupt`` with ``interrupt``:
        raised in a helper thread, it is the code's own) becomes one line: ``failed (Error: message)``; an
        error already said in words (a ``UserInputError``) stays as it is."""
        kinds: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt) if interrupt else (
            Exception, SystemExit)
        try:
            return fn()
        except UserInputError:
            raise
        except kinds as err:  # noqa: BLE001 - the user's code failed: one line
            raise UserInputError(f"{failed} ({describe(err)})") from None


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
    labels = {"loss_label": loss_label, "metric_label": f"--metric {part_name(metric)}" if metric is not None
              else "the metric (accuracy)" if is_builtin_dataset(dataset) else "the metric"}
    name = part_name(model)
    if is_builtin_dataset(dataset):
        data = load_dataset(dataset, data_dir, image_size=image_size, channels=channels, seed=seed)
        classes, in_channels = data.num_classes, data.input_shape[0]
        return Task(name, lambda: _model(model, name, classes, in_channels), (data.train_x, data.train_y),
                    (data.test_x, data.test_y), loss_fn, metric_fn if metric is not None else _accuracy, **labels)
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
                    **labels)
    return Task(name, lambda: _model(model, name, None, None), train, test, loss_fn, metric_fn, **labels)


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
    try:
        n = len(obj)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's __len__ failed: one line
        raise UserInputError(f"{label}: the {split} dataset's __len__ failed ({describe(err)})") from None
    if n == 0:
        raise UserInputError(f"{label}: the {split} dataset is empty (length 0)")
    return MapSamples(obj, collate, label if split == "training" else f"{label} (its {split} data)")


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


def _data_label(data: Any) -> str:
    """How errors name ``data``: a user's dataset by its option (``--dataset mypkg.data:make``)."""
    return data.label if isinstance(data, MapSamples) else "the dataset"
