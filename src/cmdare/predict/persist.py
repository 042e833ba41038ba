"""Saving fitted models safely, with the provenance of their training data.

Estimators whose fitted state is a few arrays (``StepTimeModel``, ``PSQueueModel``) are saved as
plain JSON (class name, constructor parameters, fitted attributes). Those holding scikit-learn
objects (``CheckpointModel``) go through skops, loading only the types listed in
``_SKOPS_TRUSTED``: nothing is ever unpickled. A sidecar records the data fingerprint and model
version, so a cached model is refitted when the data or the code changes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from cmdare.errors import DataFormatError

__all__ = ["MODEL_VERSION", "data_fingerprint", "load_json_model", "load_model", "save_model"]

MODEL_VERSION = 1

_JSON_CLASSES = {
    "StepTimeModel": ("cmdare.predict.step_time", "StepTimeModel"),
    "PSQueueModel": ("cmdare.predict.cluster_speed", "PSQueueModel"),
}
_SKOPS_TRUSTED = {
    "cmdare.predict.checkpoint.CheckpointModel",
    "cmdare.predict.checkpoint._LinearPlusSVR",
    "sklearn.linear_model._base.LinearRegression",
    "sklearn.pipeline.Pipeline",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.svm._classes.SVR",
}


def data_fingerprint(paths: list[Path]) -> str:
    """SHA-256 over the bytes of the given files (sorted by path)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.name).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _to_jsonable(value):
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_jsonable(value):
    if isinstance(value, dict) and "__array__" in value:
        return np.asarray(value["__array__"], dtype=float)
    return value


def save_model(model, path: Path, provenance: dict) -> Path:
    """Write ``model`` to ``path`` (``.json`` or ``.skops``) and ``path + .meta.json``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = type(model).__name__
    if path.suffix == ".json" and name == "StartupModel":
        path.write_text(json.dumps({"class": name, "startup": model.to_json()}, indent=1))
    elif path.suffix == ".json":
        if name not in _JSON_CLASSES:
            raise DataFormatError(f"{name} cannot be saved as JSON; use a .skops path")
        fitted = {k: _to_jsonable(v) for k, v in vars(model).items() if k.endswith("_") and not k.startswith("_")}
        payload = {"class": name, "params": model.get_params(), "fitted": fitted}
        path.write_text(json.dumps(payload, indent=1))
    else:
        import skops.io as sio

        sio.dump(model, path)
    meta = {"class": name, "model_version": MODEL_VERSION, **provenance}
    Path(str(path) + ".meta.json").write_text(json.dumps(meta, indent=1))
    return path


def load_json_model(path: Path):
    """Rebuild an estimator saved as JSON (only the classes in ``_JSON_CLASSES``)."""
    import importlib

    payload = json.loads(Path(path).read_text())
    if payload.get("class") == "StartupModel":
        from cmdare.predict.startup import StartupModel

        return StartupModel.from_json(payload["startup"])
    if payload.get("class") not in _JSON_CLASSES:
        raise DataFormatError(f"{path}: unknown model class {payload.get('class')!r}")
    module, cls = _JSON_CLASSES[payload["class"]]
    model = getattr(importlib.import_module(module), cls)(**payload["params"])
    for key, value in payload["fitted"].items():
        setattr(model, key, int(value) if key == "n_features_in_" else _from_jsonable(value))
    return model


def load_model(path: Path, expect_fingerprint: str | None = None):
    """Load a saved model, or return None if it is missing, stale or of another version.

    Raises:
        DataFormatError: if a skops file holds types outside the trusted list.
    """
    path = Path(path)
    meta_path = Path(str(path) + ".meta.json")
    if not path.exists() or not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        return None
    if meta.get("model_version") != MODEL_VERSION:
        return None
    # A model refitted with cmdare's own store rows extends the public data it was built on.
    if expect_fingerprint is not None and expect_fingerprint not in (
        meta.get("data_fingerprint"),
        meta.get("base_fingerprint"),
    ):
        return None
    if path.suffix == ".json":
        return load_json_model(path)
    import skops.io as sio

    untrusted = set(sio.get_untrusted_types(file=path))
    extra = untrusted - _SKOPS_TRUSTED
    if extra:
        raise DataFormatError(f"{path}: refusing to load untrusted types {sorted(extra)}")
    return sio.load(path, trusted=sorted(untrusted))
