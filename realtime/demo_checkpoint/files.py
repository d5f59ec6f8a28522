"""Writing the checkpoint folder, and recognising one this package wrote.

Every build is byte-identical (fixed seeds, sorted keys, no timestamps); a marker
file records the builder version and each file's digest, so a cached copy that
is stale or was cut short is noticed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import attrs

from realtime.demo_checkpoint.config import SMALL, DemoSize, demo_config
from realtime.demo_checkpoint.layout import contiguous, to_checkpoint_layout
from realtime.demo_checkpoint.quantize import quantize as quantize_weights
from realtime.demo_checkpoint.tokenizer import (
    SPECIAL_TOKENS_MAP,
    tokenizer_config,
    tokenizer_json,
    tokenizer_tables,
)
from realtime.demo_checkpoint.weights import Array, mlx_weights

log = logging.getLogger("realtime.demo_checkpoint")

# Bump whenever the bytes this package writes change: cached copies are rebuilt.
BUILDER_VERSION = 1
MARKER_FILE = "realtime_demo.json"
INDEX_FILE = "model.safetensors.index.json"


def _json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def _write_shards(directory: Path, tensors: dict[str, Array]) -> list[str]:
    """Two shards (speech-to-text, then the rest) and their index, as the real uploads."""
    from safetensors.numpy import save_file

    groups = {
        1: {k: v for k, v in tensors.items() if k.startswith("stt_model.")},
        2: {k: v for k, v in tensors.items() if not k.startswith("stt_model.")},
    }
    count = len(groups)
    weight_map: dict[str, str] = {}
    total = 0
    names: list[str] = []
    for number, group in groups.items():
        shard = f"model-{number:05d}-of-{count:05d}.safetensors"
        ordered = {k: contiguous(group[k]) for k in sorted(group)}
        save_file(ordered, str(directory / shard), metadata={"format": "pt"})
        for key, value in ordered.items():
            weight_map[key] = shard
            total += int(value.nbytes)
        names.append(shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(_json_text(index), encoding="utf-8")
    return names


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_demo_checkpoint(
    directory: str | Path, quantize: int | None = None, size: DemoSize = SMALL
) -> Path:
    """Write the demo checkpoint into ``directory`` (created if needed) and return it.

    Runs a little MLX (to read parameter shapes and to quantize), on the calling thread.
    """
    if quantize not in (None, 4, 8):
        raise ValueError(f"quantize must be None, 4 or 8, got {quantize!r}")
    started = time.perf_counter()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = demo_config(quantize, size)
    vocab, merges = tokenizer_tables()
    tensors = to_checkpoint_layout(mlx_weights(config, vocab), config)
    if quantize is not None:
        tensors = quantize_weights(tensors, quantize)

    files = _write_shards(path, tensors)
    texts = {
        "config.json": _json_text(config),
        "tokenizer.json": tokenizer_json(vocab, merges),
        "tokenizer_config.json": _json_text(tokenizer_config(vocab)),
        "special_tokens_map.json": _json_text(SPECIAL_TOKENS_MAP),
    }
    for name, text in texts.items():
        (path / name).write_text(text, encoding="utf-8")
    files += [INDEX_FILE, *texts]
    for name in files:
        (path / name).chmod(0o644)
    marker: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "description": "realtime demo checkpoint: random weights, speaks noise",
        "files": {name: _sha256(path / name) for name in sorted(files)},
        "quantize": quantize,
    }
    if size.name != SMALL.name:
        # The tiny preset's marker stays as it always was; another preset records its
        # dimensions too, so a cached copy built from older dimensions is rebuilt.
        marker["size"] = size.name
        marker["dimensions"] = _dimensions(size)
    (path / MARKER_FILE).write_text(_json_text(marker), encoding="utf-8")
    (path / MARKER_FILE).chmod(0o644)
    path.chmod(0o755)
    log.info(
        "wrote the %s demo checkpoint %s (%s) in %.2f s",
        size.name,
        path,
        "float32" if quantize is None else f"{quantize}-bit LLM",
        time.perf_counter() - started,
    )
    return path


def is_demo_checkpoint(directory: str | Path) -> bool:
    """A folder this package wrote (any builder version)."""
    return (Path(directory) / MARKER_FILE).is_file()


def _dimensions(size: DemoSize) -> dict[str, Any]:
    """The preset's dimensions as JSON values (tuples as lists), for the marker."""
    return json.loads(json.dumps(attrs.asdict(size)))  # type: ignore[no-any-return]


def demo_checkpoint_is_complete(
    directory: str | Path, quantize: int | None = None, size: DemoSize = SMALL
) -> bool:
    """Whether ``directory`` holds an intact demo checkpoint of ``size`` from this
    builder version."""
    path = Path(directory)
    try:
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        if marker.get("builder_version") != BUILDER_VERSION or marker.get("quantize") != quantize:
            return False
        if marker.get("size", SMALL.name) != size.name:
            return False
        if size.name != SMALL.name and marker.get("dimensions") != _dimensions(size):
            return False
        files: dict[str, str] = marker["files"]
        return bool(all(_sha256(path / name) == digest for name, digest in files.items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
