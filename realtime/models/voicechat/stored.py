"""VoiceChat's prompt states as safetensors files (:mod:`realtime.models.state_files`
keeps them; here is what a file holds and how it is read back).

A file is MLX's own safetensors writer's (``mx.save_safetensors``: the arrays' exact
bytes, bfloat16 included) with a header that holds the entry's key and a SHA-256 of
every array's name, dtype, shape and bytes; reading checks that digest before any
array is used, so a file whose data was cut or changed is refused (a file whose
header was damaged is refused by the reader or by its key).

- A language part (the Nemotron-H caches after a prompt) is stored layer by layer:
  each layer's arrays and its plain fields (offsets, counters), put back onto a blank
  layer of the same class (``make_cache``), so the buffers, their zero tails and the
  counters are the stored session's exactly.
- A voice chain (:class:`~realtime.models.voicechat.prompt.VoiceChain`) is stored as
  its warm-up entries, every recorded step's keys and values concatenated per layer,
  and every step's code and key stacked; read back, each step's entries are the same
  bits, so every voice part rebuilt from it is (tests/models/test_state_files.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import mlx.core as mx
import numpy as np

DIGEST_FIELD: Final = "realtime.digest"
META_FIELD: Final = "realtime.meta"


def _raw(array: Any) -> bytes:
    """An array's bytes as stored (bfloat16 through a 16-bit integer view)."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    return bytes(np.ascontiguousarray(np.array(array)).tobytes())


def digest(arrays: Mapping[str, Any]) -> str:
    """SHA-256 of the arrays' names, dtypes, shapes and bytes, in name order."""
    total = hashlib.sha256()
    for name in sorted(arrays):
        array = arrays[name]
        total.update(f"{name}\0{array.dtype}\0{tuple(array.shape)}\0".encode())
        total.update(_raw(array))
    return total.hexdigest()


def save(path: Path, arrays: Mapping[str, Any], metadata: Mapping[str, str], meta: object) -> None:
    """Write ``arrays`` with ``metadata`` (the file's key), ``meta`` (JSON) and their
    digest to ``path``, and make it durable."""
    mx.eval(*arrays.values())
    header = {
        **metadata,
        META_FIELD: json.dumps(meta, sort_keys=True),
        DIGEST_FIELD: digest(arrays),
    }
    mx.save_safetensors(str(path), dict(arrays), metadata=header)
    with path.open("rb+") as file:
        os.fsync(file.fileno())


def load(path: Path) -> tuple[dict[str, Any], Any, dict[str, str]]:
    """The arrays, ``meta`` and header of a file :func:`save` wrote; ValueError when
    its data does not match its digest."""
    loaded: Any = mx.load(str(path), return_metadata=True)
    arrays, header = loaded
    if not isinstance(arrays, dict) or not isinstance(header, dict):
        raise ValueError("not a file of named arrays")
    if header.get(DIGEST_FIELD) != digest(arrays):
        raise ValueError("its data does not match its digest (cut short or changed)")
    return arrays, json.loads(header[META_FIELD]), dict(header)


# --- cache layers (a language part) ---------------------------------------------------


def layers_to_arrays(cache: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Each layer's arrays (``"<layer>.<field>"``, a list's items ``.<i>``) and its
    layout: its class and the plain fields; ValueError for a field of any other kind."""
    arrays: dict[str, Any] = {}
    layout: list[dict[str, Any]] = []
    for index, layer in enumerate(cache):
        fields: dict[str, Any] = {}
        for name, value in vars(layer).items():
            if isinstance(value, mx.array):
                arrays[f"{index}.{name}"] = value
                fields[name] = {"array": True}
            elif isinstance(value, list) and all(
                v is None or isinstance(v, mx.array) for v in value
            ):
                for item, v in enumerate(value):
                    if v is not None:
                        arrays[f"{index}.{name}.{item}"] = v
                fields[name] = {"list": [v is not None for v in value]}
            elif value is None or isinstance(value, (bool, int, float, str)):
                fields[name] = {"value": value}
            else:
                raise ValueError(f"cannot store {type(layer).__name__}.{name} ({type(value)})")
        layout.append({"class": type(layer).__name__, "fields": fields})
    return arrays, layout


def layers_from_arrays(
    blank: list[Any], arrays: Mapping[str, Any], layout: list[dict[str, Any]]
) -> list[Any]:
    """``blank`` (new layers of the model's own classes) given the stored fields."""
    if len(blank) != len(layout):
        raise ValueError(f"{len(layout)} stored layers for a model of {len(blank)}")
    for index, (layer, stored) in enumerate(zip(blank, layout, strict=True)):
        if type(layer).__name__ != stored["class"]:
            raise ValueError(f"layer {index} is a {type(layer).__name__}, not {stored['class']}")
        for name, field in stored["fields"].items():
            if "array" in field:
                value: Any = arrays[f"{index}.{name}"]
            elif "list" in field:
                value = [
                    arrays[f"{index}.{name}.{item}"] if present else None
                    for item, present in enumerate(field["list"])
                ]
            else:
                value = field["value"]
            setattr(layer, name, value)
    return blank


__all__ = ["digest", "layers_from_arrays", "layers_to_arrays", "load", "save"]
