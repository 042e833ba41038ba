"""``cmdare export``: a run's trained model as a plain PyTorch ``state_dict``, buffers included.

The checkpoint holds the parameters as one flat vector in the model's parameter order and the buffers
(batch-norm statistics) by name; :func:`checkpoint_state_dict` puts them back into the run's network and
returns its ``state_dict``. Two formats: ``torch`` (``torch.save``; ``torch.load(FILE, weights_only=True)``
reads it) and ``safetensors`` (the Hugging Face format: an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the raw bytes; written here without the
``safetensors`` package, read by ``safetensors.torch.load_file``). Neither needs cmdare to be loaded.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from cmdare.errors import CheckpointError, UserInputError
from cmdare.output_files import check_output, open_output
from cmdare.storage import Storage
from cmdare.train.duties.checkpoint import Checkpoint, CheckpointStore
from cmdare.train.spec import TrainSpec

__all__ = ["FORMATS", "Exported", "checkpoint_state_dict", "export_run", "write_safetensors"]

FORMATS = ("torch", "safetensors")
#: torch dtype name -> safetensors dtype code
_SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                       "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


@dataclass(frozen=True)
class Exported:
    """What :func:`export_run` wrote."""

    path: Path
    step: int
    model: str
    tensors: int
    parameters: int


def checkpoint_state_dict(ckpt: Checkpoint, spec: TrainSpec) -> dict[str, Any]:
    """The ``state_dict`` of ``spec``'s network holding ``ckpt``'s parameters and buffers (CPU tensors).

    Raises:
        CheckpointError: the checkpoint does not fit the network (another model, or missing buffers).
    """
    import torch

    model = spec.task().build()
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    if ckpt.params.size != count:
        raise CheckpointError(f"the checkpoint of step {ckpt.step} holds {ckpt.params.size:,} parameters; "
                              f"{spec.model_name} has {count:,}")
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(np.ascontiguousarray(ckpt.params, np.float32)), params)
        own = dict(model.named_buffers())
        missing = sorted(name for name, b in own.items() if name not in ckpt.buffers and b.is_floating_point())
        if missing and ckpt.buffers:
            raise CheckpointError(f"the checkpoint of step {ckpt.step} lacks buffers {', '.join(missing[:3])}")
        for name, value in ckpt.buffers.items():
            if name in own:
                own[name].copy_(torch.from_numpy(np.asarray(value)).reshape(own[name].shape))
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def write_safetensors(tensors: dict[str, Any], path: str | os.PathLike[str], metadata: dict[str, str] | None = None,
                      force: bool = False) -> Path:
    """Write CPU tensors in the safetensors format (header, then each tensor's bytes in name order), as
    :func:`cmdare.output_files.open_output` writes a file: never over an existing one unless ``force``."""
    with open_output(path, "--output", force) as f:
        _safetensors_into(f, tensors, metadata)
    return Path(path).expanduser()


def _safetensors_into(f: IO[bytes], tensors: dict[str, Any], metadata: dict[str, str] | None) -> None:
    import torch

    header: dict[str, Any] = {"__metadata__": dict(metadata or {})} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _SAFETENSORS_DTYPES:
            raise UserInputError(f"tensor {name}: dtype {dtype} has no safetensors code")
        # numpy has no bfloat16: its bytes go through an int16 view
        raw = (t.view(torch.int16) if dtype == "bfloat16" else t).numpy().tobytes()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes with trailing spaces
    f.write(struct.pack("<Q", len(head)))
    f.write(head)
    for raw in blobs:
        f.write(raw)


def export_run(storage: Storage, output: str | os.PathLike[str], fmt: str = "torch",
               step: int | None = None, spec: TrainSpec | None = None, force: bool = False) -> Exported:
    """Write the model of the run stored at ``storage`` (its checkpoint of ``step``, default the newest).
    ``spec``: the run's spec (default: the one the checkpoint records; give it for a run of Python objects
    that no other process can import). The file is written as :func:`cmdare.output_files.open_output` writes:
    whole or not at all, never over an existing file or through a symbolic link unless ``force``.

    Raises:
        UserInputError: an unknown format, or an output that cannot be written (checked before the checkpoint
            is read).
        CheckpointError: no such checkpoint, or one that does not fit the run's network.
    """
    if fmt not in FORMATS:
        raise UserInputError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = check_output(output, "--output", force)
    store = CheckpointStore(storage)
    ckpt = store.load(store.resume_point(step))
    if spec is None:
        spec_dict = (ckpt.meta or {}).get("spec")
        if not isinstance(spec_dict, dict):
            raise CheckpointError(f"the checkpoint of step {ckpt.step} in {storage.uri} does not name its run's "
                                  "model")
        spec = TrainSpec.from_dict(spec_dict)
    state = checkpoint_state_dict(ckpt, spec)
    with open_output(out, "--output", force) as f:
        if fmt == "torch":
            import torch

            torch.save(state, f)
        else:
            _safetensors_into(f, state, {"model": spec.model_name, "step": str(ckpt.step), "format": "pt"})
    count = sum(int(t.numel()) for k, t in state.items() if t.is_floating_point())
    return Exported(out, ckpt.step, spec.model_name, len(state), count)
