"""Writing the checkpoint folder, and recognising one this package wrote.

Every build is byte-identical (fixed seeds, sorted keys, no timestamps); a marker
file records the builder version and each file's digest, so a cached copy that
is stale or was cut short is noticed and rebuilt.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import numpy as np

from realtime.demo.checkpoint.config import SMALL, DemoSize, demo_config
from realtime.demo.checkpoint.layout import checkpoint_tensors, contiguous, front_end_buffers
from realtime.demo.checkpoint.quantize import quantized
from realtime.demo.checkpoint.tokenizer import (
    SPECIAL_TOKENS_MAP,
    Vocab,
    tokenizer_config,
    tokenizer_json,
    tokenizer_tables,
)
from realtime.demo.checkpoint.weights import Array, DemoWeights

log = logging.getLogger(__name__)

T = TypeVar("T")

# Bump whenever the bytes this package writes change: cached copies are rebuilt.
BUILDER_VERSION = 1
MARKER_FILE = "realtime_demo.json"
INDEX_FILE = "model.safetensors.index.json"


def _json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


SHARD_BYTES: Final = 4 * 1024**3
"""A shard closes before it would pass this many bytes (the real uploads' shards are
about 5 GB); one tensor larger than that gets a shard of its own."""


def _bfloat16_bits(value: Array) -> Array:
    """float32 values rounded to bfloat16 (to nearest, ties to even), as their 16 bits."""
    bits = np.asarray(value).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return np.asarray(rounded, dtype=np.uint16)  # a 0-d array stays an array


Stored = tuple[str, str, Array]
"""A tensor as a shard stores it: its name, safetensors dtype and C-ordered data."""


def _stored(name: str, value: Array, bfloat16: bool) -> Stored:
    if bfloat16 and value.dtype == np.float32:
        return name, "bfloat16", _bfloat16_bits(value)
    return name, value.dtype.name, contiguous(value)


class _Shards:
    """Safetensors shards written as the tensors come, so a checkpoint of any size
    holds about one shard in memory: speech-to-text tensors first, then the rest, as
    the real uploads, each group cut at :data:`SHARD_BYTES`. Shards are named
    ``model-0000i-of-0000n`` and indexed once the count is known (:meth:`close`)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._group: str | None = None
        self._pending: dict[str, tuple[str, Array]] = {}
        self._pending_bytes = 0
        self._parts: list[tuple[Path, list[tuple[str, int]]]] = []

    def add(self, tensor: Stored) -> None:
        name, dtype, value = tensor
        group = "stt" if name.startswith("stt_model.") else "rest"
        if self._pending and (
            group != self._group or self._pending_bytes + value.nbytes > SHARD_BYTES
        ):
            self._flush()
        self._group = group
        self._pending[name] = (dtype, value)
        self._pending_bytes += int(value.nbytes)

    def _flush(self) -> None:
        from safetensors import TensorSpec, serialize_file

        path = self._directory / f".part-{len(self._parts):05d}"
        pending = sorted(self._pending.items())
        specs = {
            name: TensorSpec(
                dtype=dtype, shape=value.shape, data_ptr=value.ctypes.data, data_len=value.nbytes
            )
            for name, (dtype, value) in pending
        }
        serialize_file(specs, str(path), metadata={"format": "pt"})
        sizes = [(name, int(value.nbytes)) for name, (_, value) in pending]
        self._parts.append((path, sizes))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Write what is pending, name the shards, write the index; the shards' names."""
        if self._pending:
            self._flush()
        count = len(self._parts)
        weight_map: dict[str, str] = {}
        total = 0
        names: list[str] = []
        for number, (part, sizes) in enumerate(self._parts, start=1):
            shard = f"model-{number:05d}-of-{count:05d}.safetensors"
            part.replace(self._directory / shard)
            for name, nbytes in sizes:
                weight_map[name] = shard
                total += nbytes
            names.append(shard)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (self._directory / INDEX_FILE).write_text(_json_text(index), encoding="utf-8")
        return names


def _in_order(
    pool: Executor, work: Callable[[str], T], items: list[str], ahead: int
) -> Iterator[T]:
    """``work`` over ``items`` on ``pool``, results in order, at most ``ahead`` of them
    computed and not yet taken (so memory holds a few tensors, not the model)."""
    queued: collections.deque[Future[T]] = collections.deque()
    rest = iter(items)
    for item in itertools.islice(rest, ahead):
        queued.append(pool.submit(work, item))
    while queued:
        result = queued.popleft().result()
        for item in itertools.islice(rest, 1):
            queued.append(pool.submit(work, item))
        yield result


def _checkpoint(
    config: dict[str, Any], vocab: Vocab, quantize: int | None, bfloat16: bool
) -> Iterator[Stored]:
    """Every tensor of the checkpoint, as stored, in the order of their parameters.

    The random draws and layouts (numpy, which lets go of the GIL while it fills an
    array) run on a few worker threads, bounded and in order, because the ``full``
    preset draws 11 B numbers; quantizing (MLX) stays on the calling thread.
    """
    weights = DemoWeights(config, vocab)

    def prepare(parameter: str) -> list[tuple[str, Array]]:
        return checkpoint_tensors(parameter, weights.tensor(parameter), config)

    for name, value in front_end_buffers():
        yield _stored(name, value, bfloat16)
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="demo-weights") as pool:
        for parts in _in_order(pool, prepare, weights.names(), ahead=2 * workers):
            for name, value in parts:
                pieces = [(name, value)] if quantize is None else quantized(name, value, quantize)
                for stored, piece in pieces:
                    yield _stored(stored, piece, bfloat16)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def write_demo_checkpoint(
    directory: str | Path, quantize: int | None = None, size: DemoSize = SMALL
) -> Path:
    """Write the demo checkpoint into ``directory`` (created if needed) and return it.

    Runs a little MLX (to read parameter shapes and to quantize), on the calling thread.
    Tensors are made, laid out, quantized and written one at a time.
    """
    if quantize not in (None, 4, 8):
        raise ValueError(f"quantize must be None, 4 or 8, got {quantize!r}")
    if size.weight_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"weight_dtype must be float32 or bfloat16, got {size.weight_dtype!r}")
    started = time.perf_counter()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = demo_config(quantize, size)
    vocab, merges = tokenizer_tables()
    shards = _Shards(path)
    for tensor in _checkpoint(config, vocab, quantize, bfloat16=size.weight_dtype == "bfloat16"):
        shards.add(tensor)
    files = shards.close()
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
        size.weight_dtype if quantize is None else f"{quantize}-bit LLM",
        time.perf_counter() - started,
    )
    return path


def is_demo_checkpoint(directory: str | Path) -> bool:
    """A folder this package wrote (any builder version)."""
    return (Path(directory) / MARKER_FILE).is_file()


def _dimensions(size: DemoSize) -> dict[str, Any]:
    """The preset's dimensions as JSON values (tuples as lists), for the marker (its
    default ``quantize`` is not one: the marker records the bits it was built with)."""
    fields = attrs.asdict(size, filter=lambda field, _: field.name != "quantize")
    return json.loads(json.dumps(fields))  # type: ignore[no-any-return]


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
