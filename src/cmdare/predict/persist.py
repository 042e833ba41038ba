"""Saving fitted models safely, with the provenance of their training data.

Every model is saved as plain JSON: class name (from a fixed list), constructor parameters and
fitted attributes. ``CheckpointModel`` (a linear model plus an SVR) is saved with its training rows
and rebuilt by refitting, which is exact (libsvm is deterministic) and takes milliseconds. Nothing
is ever unpickled, and no file can name a class outside ``_JSON_CLASSES``. A ``.meta.json``
sidecar records the data fingerprint and model version, so a cached model is refitted when the
data or the code changes. (skops was the alternative; importing it costs ~10 s, as it imports
every scikit-learn estimator, so it is not used.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from cmdare.errors import DataFormatError

__all__ = ["MODEL_VERSION", "data_fingerprint", "load_json_model", "load_model", "save_model"]

MODEL_VERSION = 4  # 4: issue 45, the step-time model answers unseen GPUs by generation

_JSON_CLASSES = {
    "StepTimeModel": ("cmdare.predict.step_time", "StepTimeModel"),
    "PSQueueModel": ("cmdare.predict.cluster_speed", "PSQueueModel"),
    "CheckpointModel": ("cmdare.predict.checkpoint", "CheckpointModel"),
}
_REFIT_CLASSES = {"CheckpointModel"}  # rebuilt from their saved training rows


def data_fingerprint(paths: list[Path]) -> str:
    """SHA-256 over the bytes of the given files (sorted by path)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.name).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _to_jsonable(value):
    if isinstance(value, np.ndarray):
        return {
            "__array__": np.where(np.isnan(value), None, value).tolist() if value.dtype.kind == "f" else value.tolist()
        }
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_jsonable(value):
    if isinstance(value, dict) and "__array__" in value:
        return np.array(value["__array__"], dtype=float)  # None (a saved NaN) -> nan
    return value


def save_model(model, path: Path, provenance: dict) -> Path:
    """Write ``model`` as JSON to ``path`` and its provenance to ``path + .meta.json``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = type(model).__name__
    if name == "StartupModel":
        path.write_text(json.dumps({"class": name, "startup": model.to_json()}, indent=1))
    else:
        if name not in _JSON_CLASSES:
            raise DataFormatError(f"{name} cannot be saved as JSON")
        if name in _REFIT_CLASSES:
            fitted = {"X_fit_": _to_jsonable(model.X_fit_), "y_fit_": _to_jsonable(model.y_fit_)}
        else:
            fitted = {k: _to_jsonable(v) for k, v in vars(model).items() if k.endswith("_") and not k.startswith("_")}
        payload = {"class": name, "params": model.get_params(), "fitted": fitted}
        path.write_text(json.dumps(payload, indent=1))
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
    try:
        model = getattr(importlib.import_module(module), cls)(**payload["params"])
        if payload["class"] in _REFIT_CLASSES:
            fitted = payload["fitted"]
            return model.fit(_from_jsonable(fitted["X_fit_"]), _from_jsonable(fitted["y_fit_"]))
        for key, value in payload["fitted"].items():
            if not key.endswith("_") or key.startswith("_"):
                raise DataFormatError(f"{path}: {key!r} is not a fitted attribute")
            setattr(model, key, int(value) if key == "n_features_in_" else _from_jsonable(value))
    except (TypeError, KeyError, ValueError) as err:
        raise DataFormatError(f"{path}: not a valid saved {cls} ({err})") from err
    return model


def load_model(path: Path, expect_fingerprint: str | None = None):
    """Load a saved model, or return None if it is missing, stale or of another version.

    Raises:
        DataFormatError: if the file names a class outside the allowed list.
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
    return load_json_model(path)
