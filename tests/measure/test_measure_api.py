"""The public API of cmdare.measure is pinned: names others call must not silently change."""

from __future__ import annotations

import importlib
import inspect

import cmdare.measure as measure


def test_exported_names():
    assert measure.__all__ == sorted(
        [
            "LIFETIME_MODELS",
            "LifetimeModel",
            "REPORTS",
            "Store",
            "StoreRecorder",
            "TensorBoardCallback",
            "build_report",
            "load_lifetime_model",
            "open_store",
        ]
    )
    for name in measure.__all__:  # each name resolves to the object of the module it lives in
        assert getattr(measure, name) is getattr(importlib.import_module(measure._EXPORTS[name]), name), name


def test_signatures_others_rely_on():
    assert list(inspect.signature(measure.open_store).parameters)[:1] == ["url"]
    assert list(inspect.signature(measure.StoreRecorder).parameters) == ["store_or_url", "batch_size"]
    assert inspect.signature(measure.StoreRecorder).parameters["batch_size"].default == 200
    assert list(inspect.signature(measure.TensorBoardCallback).parameters)[:1] == ["logdir"]
    assert list(inspect.signature(measure.load_lifetime_model).parameters) == ["spec"]
    model = measure.load_lifetime_model("bathtub")
    assert list(inspect.signature(model.sample).parameters) == ["rng", "size"]
    assert list(inspect.signature(model.fit).parameters) == ["lifetimes_s", "censored"]
    assert set(measure.LIFETIME_MODELS) == {"exponential", "bathtub", "empirical"}
    assert set(measure.REPORTS) == {"lifetimes", "scaling", "startup", "checkpoint", "run"}
